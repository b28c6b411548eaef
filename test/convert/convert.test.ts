/* `starling convert` end to end: a real registry, umoci-built images, the Go reference, containerd and ctr-remote. */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { after, before, test } from 'node:test';
import { gunzipSync, gzipSync } from 'node:zlib';
import {
  fileSource,
  openEstargz,
  registryBlobSource,
  verifyEstargz,
  TOC_DIGEST_ANNOTATION,
  UNCOMPRESSED_SIZE_ANNOTATION,
  ZSTD_MANIFEST_CHECKSUM_ANNOTATION,
  ZSTD_MANIFEST_POSITION_ANNOTATION,
  type RangeSource,
} from '../../src/estargz/index.js';
import { RegistryClient } from '../../src/oci/client.js';
import { RegistryHosts } from '../../src/oci/registry-hosts.js';
import { MediaType } from '../../src/oci/media-types.js';
import { entryOf, harness, harnessSkip, readTarOracle, sha256hex } from '../estargz/helpers.js';
import { startContainerd, writeHostsToml, type Containerd } from '../fixtures/containerd.js';
import { buildImage, pushImage, type BuiltImage } from '../fixtures/images.js';
import { makeTempDir, run, type TempDir } from '../fixtures/processes.js';
import { startRegistry, type Registry } from '../fixtures/registry.js';
import { itemAt } from '../../src/common/indexing.js';

const MAIN = resolve(import.meta.dirname, '../../src/cli/main.ts');
const CHUNK = 1 << 20;

let registry: Registry;
let tmp: TempDir;
let image: BuiltImage;
let client: RegistryClient;
let srcDigest: string;
/** The conversion every registry test inspects: src/img:v1 → dst/img:esgz. */
let converted: { stdout: string; manifest: any; config: any };

interface Manifest {
  config: { digest: string };
  layers: Array<{ digest: string; size: number; mediaType: string; annotations?: Record<string, string> }>;
}

/** A converted layer's TOC digest, from its annotation. */
function tocDigestOf(layer: Manifest['layers'][number]): string {
  const digest = layer.annotations?.[TOC_DIGEST_ANNOTATION];
  assert.ok(digest, `layer ${layer.digest} has no ${TOC_DIGEST_ANNOTATION} annotation`);
  return digest;
}

async function starling(...args: string[]) {
  return run(process.execPath, ['--import', 'tsx', MAIN, ...args], { timeoutMs: 60_000 });
}

async function getJson(repo: string, reference: string): Promise<any> {
  return JSON.parse((await client.getManifest(repo, reference)).bytes.toString());
}

async function getBlobBytes(repo: string, digest: string): Promise<Buffer> {
  const { body } = await client.getBlob(repo, digest);
  return Buffer.from(await new Response(body as unknown as ReadableStream).arrayBuffer());
}

/** Regular files of the original image's layers (OCI layout, gzip tars), per layer, via an independent tar reader. */
async function originalLayerFiles(): Promise<Array<Map<string, { sha256?: string; type: string }>>> {
  return Promise.all(
    image.layers.map(async (layer) =>
      readTarOracle(gunzipSync(await readFile(join(image.layoutDir, 'blobs/sha256', layer.digest.slice(7))))),
    ),
  );
}

/** Starling's reader and verifier accept each layer with its annotated TOC digest; returns the readers' sources closed. */
async function verifyLayers(manifest: Manifest, open: (digest: string) => Promise<RangeSource>, diffIDs: string[]) {
  const results = [];
  for (const [i, layer] of manifest.layers.entries()) {
    const tocDigest = layer.annotations?.[TOC_DIGEST_ANNOTATION];
    assert.ok(tocDigest, `layer ${i} has a TOC digest annotation`);
    const source = await open(layer.digest);
    const verified = await verifyEstargz(source, { tocDigest });
    assert.equal(verified.diffID, diffIDs[i], `layer ${i}: config diff_id is the verified diffID`);
    assert.equal(layer.annotations?.[UNCOMPRESSED_SIZE_ANNOTATION], String(verified.uncompressedSize));
    results.push({ source, reader: await openEstargz(source, { tocDigest }) });
  }
  return results;
}

before(async () => {
  tmp = await makeTempDir('starling-convert-test-');
  registry = await startRegistry();
  image = await buildImage({
    withBusybox: true,
    layers: [
      { sizeBytes: 3 * CHUNK + 1234, seed: 'convert-a', files: { '/etc/hello.txt': 'hello\n', '/etc/app/conf': 'x=1\n' } },
      { files: { '/app/run.sh': 'echo run\n', '/app/data.txt': 'data\n' } },
    ],
  });
  srcDigest = (await pushImage(image.layoutDir, image.tag, registry.host, 'src/img:v1')).digest;
  client = new RegistryClient(registry.host, { hosts: new RegistryHosts([registry.host]) });
  const res = await starling(
    'convert',
    `${registry.host}/src/img:v1`,
    `${registry.host}/dst/img:esgz`,
    '--insecure-registry',
    registry.host,
    '--chunk-size',
    String(CHUNK),
  );
  assert.equal(res.code, 0, res.stderr);
  const manifest = await getJson('dst/img', 'esgz');
  converted = { stdout: res.stdout, manifest, config: JSON.parse((await getBlobBytes('dst/img', manifest.config.digest)).toString()) };
});

after(async () => {
  await client?.close();
  await registry?.stop();
  await tmp?.remove();
});

test('(a) every converted layer verifies with Starling against its TOC digest annotation; files match the original', async () => {
  const { manifest, config } = converted;
  assert.equal(converted.stdout.trim(), (await client.getManifest('dst/img', 'esgz')).digest, 'prints the new manifest digest');
  assert.equal(manifest.mediaType, MediaType.OciManifest);
  assert.equal(manifest.layers.length, image.layers.length);
  for (const layer of manifest.layers) assert.equal(layer.mediaType, MediaType.OciLayerGzip);
  const layers = await verifyLayers(manifest, (d) => registryBlobSource(client, 'dst/img', d), config.rootfs.diff_ids);
  const originals = await originalLayerFiles();
  for (const [i, { reader }] of layers.entries()) {
    for (const [name, file] of itemAt(originals, i)) {
      if (file.type === 'reg') assert.equal(sha256hex(await reader.readFile(name)), file.sha256, `layer ${i} ${name}`);
    }
    assert.ok(reader.lookup('.no.prefetch.landmark'), 'no prioritized files: .no.prefetch.landmark');
  }
  assert.ok(entryOf(itemAt(layers, 1).reader, 'data/layer0.bin').chunks.length >= 4, 'the large file is chunked');
  // Only the new blobs were uploaded: nothing was copied twice, the tag was written once.
  assert.equal(registry.requests().filter((r) => r.method === 'PUT' && r.uri === '/v2/dst/img/manifests/esgz').length, 1);
});

test('(b) the Go reference verifies every converted layer (TOC digest and every chunk)', { skip: harnessSkip }, async () => {
  for (const [i, layer] of (converted.manifest as Manifest).layers.entries()) {
    const path = join(tmp.path, `go-${i}.blob`);
    await writeFile(path, await getBlobBytes('dst/img', layer.digest));
    const out = await harness(['verify-and-dump', '-blob', path, '-toc-digest', tocDigestOf(layer)]);
    const dump = out
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line));
    const original = itemAt(await originalLayerFiles(), i);
    for (const [name, file] of original) {
      if (file.type === 'reg') assert.equal(dump.find((e) => e.name === name)?.sha256, file.sha256, `Go reads layer ${i} ${name}`);
    }
  }
});

let containerd: Containerd | undefined;
after(async () => containerd?.stop());

test('(c) plain containerd pulls and runs the converted image; a file hashes as built', async () => {
  containerd = await startContainerd();
  await writeHostsToml(containerd.hostsDir, registry.host);
  const ref = `${registry.host}/dst/img:esgz`;
  await containerd.pull(ref);
  const file = itemAt(image.randomFiles, 0);
  const res = await containerd.runContainer(ref, ['sha256sum', file.path]);
  assert.equal(res.code, 0, res.stderr);
  assert.equal(res.stdout.split(/\s+/)[0], file.sha256);
  const cat = await containerd.runContainer(ref, ['cat', '/app/run.sh']);
  assert.equal(cat.stdout, 'echo run\n');
});

test('(d) ctr-remote images convert --estargz --oci output is read and verified by Starling, file by file', async () => {
  assert.ok(containerd, 'containerd started by (c)');
  const src = `${registry.host}/src/img:v1`;
  const dst = `${registry.host}/ref/img:esgz`;
  await containerd.pull(src);
  const { address } = containerd;
  const ctrRemote = (...args: string[]) => run('ctr-remote', ['--address', address, '--namespace', 'default', ...args]);
  const conv = await ctrRemote('images', 'convert', '--estargz', '--oci', '--estargz-chunk-size', String(CHUNK), src, dst);
  assert.equal(conv.code, 0, conv.stderr);
  const push = await containerd.ctr(['images', 'push', '--plain-http', dst]);
  assert.equal(push.code, 0, push.stderr);
  const manifest = await getJson('ref/img', 'esgz');
  const config = JSON.parse((await getBlobBytes('ref/img', manifest.config.digest)).toString());
  const layers = await verifyLayers(manifest, (d) => registryBlobSource(client, 'ref/img', d), config.rootfs.diff_ids);
  const originals = await originalLayerFiles();
  for (const [i, { reader }] of layers.entries()) {
    for (const [name, file] of itemAt(originals, i)) {
      const entry = reader.lookup(name);
      assert.ok(entry, `layer ${i}: ${name} in ctr-remote's TOC`);
      if (file.type === 'reg') assert.equal(sha256hex(await reader.readFile(name)), file.sha256, `layer ${i} ${name}`);
    }
  }
});

test('(e) oci:DIR to oci:DIR, eStargz and zstd:chunked; converting the output again keeps its layers', async () => {
  const out = join(tmp.path, 'layout-out');
  for (const [tag, extra] of [
    ['esgz', []],
    ['zstd', ['--zstd']],
  ] as const) {
    const res = await starling(
      'convert',
      `oci:${image.layoutDir}:${image.tag}`,
      `oci:${out}:${tag}`,
      '--chunk-size',
      String(CHUNK),
      ...extra,
    );
    assert.equal(res.code, 0, res.stderr);
    const index = JSON.parse(await readFile(join(out, 'index.json'), 'utf8'));
    const entry = index.manifests.find((m: any) => m.annotations['org.opencontainers.image.ref.name'] === tag);
    assert.equal(entry.digest, res.stdout.trim());
    const blob = (d: string) => join(out, 'blobs/sha256', d.slice(7));
    const manifest = JSON.parse(await readFile(blob(entry.digest), 'utf8'));
    const config = JSON.parse(await readFile(blob(manifest.config.digest), 'utf8'));
    const layers = await verifyLayers(manifest, (d) => fileSource(blob(d)), config.rootfs.diff_ids);
    for (const { source } of layers) await source.close?.();
    for (const layer of manifest.layers) {
      if (tag === 'zstd') {
        assert.equal(layer.mediaType, MediaType.OciLayerZstd);
        assert.match(layer.annotations[ZSTD_MANIFEST_POSITION_ANNOTATION], /^\d+:\d+:\d+:1$/);
        assert.match(layer.annotations[ZSTD_MANIFEST_CHECKSUM_ANNOTATION], /^sha256:/);
        if (!harnessSkip)
          await harness(['verify-and-dump', '-blob', blob(layer.digest), '-toc-digest', layer.annotations[TOC_DIGEST_ANNOTATION]]);
      } else {
        assert.equal(layer.mediaType, MediaType.OciLayerGzip);
      }
    }
  }
  // Already-converted layers are recognized and kept byte for byte.
  const again = await starling('convert', `oci:${out}:esgz`, `oci:${out}:again`);
  assert.equal(again.code, 0, again.stderr);
  const index = JSON.parse(await readFile(join(out, 'index.json'), 'utf8'));
  const digests = (tag: string) => index.manifests.find((m: any) => m.annotations['org.opencontainers.image.ref.name'] === tag).digest;
  const layersOf = async (tag: string) =>
    JSON.parse(await readFile(join(out, 'blobs/sha256', digests(tag).slice(7)), 'utf8')).layers.map((l: any) => l.digest);
  assert.deepEqual(await layersOf('again'), await layersOf('esgz'));
});

test('(f) --record-in puts the recorded files first in their layers, before .prefetch.landmark', async () => {
  const record = join(tmp.path, 'record.jsonl');
  await writeFile(
    record,
    [
      { path: 'etc/app/conf', manifestDigest: srcDigest, layerIndex: 1 },
      { path: itemAt(image.randomFiles, 0).path.slice(1), manifestDigest: srcDigest, layerIndex: 1 },
      { path: 'app/run.sh', manifestDigest: srcDigest, layerIndex: 2 },
    ]
      .map((r) => JSON.stringify(r))
      .join('\n') + '\n',
  );
  const res = await starling(
    'convert',
    `${registry.host}/src/img:v1`,
    `${registry.host}/dst/img:rec`,
    '--insecure-registry',
    registry.host,
    '--record-in',
    record,
  );
  assert.equal(res.code, 0, res.stderr);
  const manifest: Manifest = await getJson('dst/img', 'rec');
  const names = async (i: number) => {
    const layer = itemAt(manifest.layers, i);
    const reader = await openEstargz(await registryBlobSource(client, 'dst/img', layer.digest), { tocDigest: tocDigestOf(layer) });
    return { reader, names: reader.entries.map((e) => e.name) };
  };
  const layer1 = await names(1);
  const at = (list: string[], name: string) => {
    const index = list.indexOf(name);
    assert.ok(index >= 0, `${name} is in the layer`);
    return index;
  };
  const landmark = at(layer1.names, '.prefetch.landmark');
  assert.ok(at(layer1.names, 'etc/app/conf') < landmark);
  assert.ok(at(layer1.names, 'data/layer0.bin') < landmark);
  assert.ok(at(layer1.names, 'etc/hello.txt') > landmark, 'unrecorded files come after the landmark');
  assert.ok((layer1.reader.prefetchRange()?.length ?? 0) > 3 * CHUNK, 'the prefetch range covers the recorded big file');
  const layer2 = await names(2);
  assert.ok(at(layer2.names, 'app/run.sh') < at(layer2.names, '.prefetch.landmark'));
  assert.ok(at(layer2.names, 'app/data.txt') > at(layer2.names, '.prefetch.landmark'));
  assert.ok((await names(0)).names.includes('.no.prefetch.landmark'), 'a layer without records has no prefetch');
  // A recording of another image is refused rather than silently ignored.
  await writeFile(record, JSON.stringify({ path: 'x', manifestDigest: `sha256:${'1'.repeat(64)}`, layerIndex: 0 }) + '\n');
  const other = await starling(
    'convert',
    `${registry.host}/src/img:v1`,
    `${registry.host}/dst/img:rec2`,
    '--insecure-registry',
    registry.host,
    '--record-in',
    record,
  );
  assert.equal(other.code, 2);
  assert.match(other.stderr, /none of which is the converted manifest/);
});

test('multi-arch index: default platform, --all-platforms, and an unknown --platform', async () => {
  const src = await client.getManifest('src/img', 'v1');
  const index = {
    schemaVersion: 2,
    mediaType: MediaType.OciIndex,
    manifests: [{ mediaType: src.mediaType, digest: src.digest, size: src.bytes.length, platform: { os: 'linux', architecture: 'amd64' } }],
  };
  await client.putManifest('src/img', 'multi', Buffer.from(JSON.stringify(index)), MediaType.OciIndex);
  const flags = ['--insecure-registry', registry.host];
  const single = await starling('convert', `${registry.host}/src/img:multi`, `${registry.host}/dst/img:multi-one`, ...flags);
  assert.equal(single.code, 0, single.stderr);
  assert.equal((await getJson('dst/img', 'multi-one')).mediaType, MediaType.OciManifest);
  const all = await starling(
    'convert',
    `${registry.host}/src/img:multi`,
    `${registry.host}/dst/img:multi-all`,
    '--all-platforms',
    ...flags,
  );
  assert.equal(all.code, 0, all.stderr);
  const newIndex = await getJson('dst/img', 'multi-all');
  assert.equal(newIndex.mediaType, MediaType.OciIndex);
  assert.deepEqual(
    newIndex.manifests.map((m: any) => [m.digest, m.platform]),
    [[single.stdout.trim(), { os: 'linux', architecture: 'amd64' }]],
  );
  const bad = await starling(
    'convert',
    `${registry.host}/src/img:multi`,
    `${registry.host}/dst/img:arm`,
    '--platform',
    'linux/arm64',
    ...flags,
  );
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /no manifest for platform linux\/arm64 \(available: linux\/amd64\)/);
  assert.equal(await client.headManifest('dst/img', 'arm'), undefined, 'nothing tagged');
});

test('(g) bad input: malformed reference, corrupt layer tar, refused credentials: exit 2, nothing tagged', async () => {
  const flags = ['--insecure-registry', registry.host];
  const malformed = await starling('convert', `${registry.host}/Bad//Name:v1`, `${registry.host}/dst/img:x`, ...flags);
  assert.equal(malformed.code, 2);
  assert.match(malformed.stderr, /source ".*Bad\/\/Name:v1"/);
  const badDest = await starling('convert', `${registry.host}/src/img:v1`, `${registry.host}/dst/img@sha256:${'0'.repeat(64)}`, ...flags);
  assert.equal(badDest.code, 2);
  assert.match(badDest.stderr, /names a digest/);

  // An image whose second layer is valid gzip around a corrupt tar.
  const good = await client.getManifest('src/img', 'v1');
  const manifest = JSON.parse(good.bytes.toString());
  const garbage = Buffer.alloc(4096, 0x41);
  const corrupt = gzipSync(garbage);
  const corruptPath = join(tmp.path, 'corrupt.gz');
  await writeFile(corruptPath, corrupt);
  const corruptDigest = `sha256:${createHash('sha256').update(corrupt).digest('hex')}`;
  await client.putBlob('src/bad', { digest: corruptDigest, size: corrupt.length }, { localFile: async () => corruptPath });
  for (const layer of manifest.layers) await client.putBlob('src/bad', layer, { from: 'src/img' });
  await client.putBlob('src/bad', manifest.config, { from: 'src/img' });
  manifest.layers[1] = { mediaType: MediaType.OciLayerGzip, digest: corruptDigest, size: corrupt.length };
  await client.putManifest('src/bad', 'v1', Buffer.from(JSON.stringify(manifest)), MediaType.OciManifest);
  const res = await starling('convert', `${registry.host}/src/bad:v1`, `${registry.host}/dst/bad:v1`, ...flags);
  assert.equal(res.code, 2, res.stderr);
  assert.match(res.stderr, new RegExp(`layer 2/3 \\(${corruptDigest}\\).*tar`));
  assert.equal(await client.headManifest('dst/bad', 'v1'), undefined, 'no manifest was tagged');

  // A registry behind htpasswd: wrong credentials are refused, right ones work (Basic auth).
  const creds = { user: 'alice', password: 'secret' };
  const privateRegistry = await startRegistry({ htpasswd: creds });
  try {
    await pushImage(image.layoutDir, image.tag, privateRegistry.host, 'priv/img:v1', { creds });
    const pflags = ['--insecure-registry', privateRegistry.host];
    const refused = await starling(
      'convert',
      `${privateRegistry.host}/priv/img:v1`,
      `${privateRegistry.host}/priv/img:esgz`,
      ...pflags,
      '--src-creds',
      'alice:wrong',
      '--dest-creds',
      'alice:secret',
    );
    assert.equal(refused.code, 2);
    assert.match(
      refused.stderr,
      new RegExp(
        `registry ${privateRegistry.host}, repository priv/img: GET manifest v1: the registry refused the credentials \\(HTTP 401`,
      ),
    );
    const anonymous = await starling('convert', `${privateRegistry.host}/priv/img:v1`, `oci:${join(tmp.path, 'priv')}:x`, ...pflags);
    assert.equal(anonymous.code, 2);
    assert.match(anonymous.stderr, /requires credentials/);
    const ok = await starling(
      'convert',
      `${privateRegistry.host}/priv/img:v1`,
      `${privateRegistry.host}/priv/img:esgz`,
      ...pflags,
      '--src-creds',
      'alice:secret',
      '--dest-creds',
      'alice:secret',
    );
    assert.equal(ok.code, 0, ok.stderr);
    assert.ok(privateRegistry.requests().some((r) => r.method === 'PUT' && r.uri === '/v2/priv/img/manifests/esgz' && r.status === 201));
  } finally {
    await privateRegistry.stop();
  }
});

test('layers already in eStargz are kept and mounted across repositories of one registry', async () => {
  const res = await starling(
    'convert',
    `${registry.host}/dst/img:esgz`,
    `${registry.host}/copy/img:esgz`,
    '--insecure-registry',
    registry.host,
  );
  assert.equal(res.code, 0, res.stderr);
  const layers = (await getJson('copy/img', 'esgz')).layers.map((l: any) => l.digest);
  assert.deepEqual(
    layers,
    converted.manifest.layers.map((l: any) => l.digest),
  );
  assert.equal(res.stdout.trim(), converted.stdout.trim(), 'same layers and config: the same manifest');
  const mounts = registry.requests().filter((r) => r.method === 'POST' && r.uri.startsWith('/v2/copy/img/blobs/uploads/?mount='));
  assert.equal(mounts.length, layers.length + 1, 'every layer and the config');
  assert.ok(mounts.every((r) => r.status === 201));
  assert.equal(
    registry.requests().filter((r) => r.method === 'PUT' && r.uri.startsWith('/v2/copy/img/blobs/')).length,
    0,
    'nothing uploaded',
  );
});

test('estargz verify|ls|cat on a registry layer read with Range requests', async () => {
  const layer = itemAt((converted.manifest as Manifest).layers, 1);
  const ref = `${registry.host}/dst/img@${layer.digest}`;
  const flags = ['--insecure-registry', registry.host];
  const verify = await starling('estargz', 'verify', ref, '--toc-digest', tocDigestOf(layer), ...flags);
  assert.equal(verify.code, 0, verify.stderr);
  assert.equal(JSON.parse(verify.stdout).tocDigest, tocDigestOf(layer));
  const ls = await starling('estargz', 'ls', ref, ...flags);
  assert.match(ls.stdout, /reg .* etc\/hello\.txt/);
  const before = registry.requests().length;
  const cat = await starling('estargz', 'cat', ref, 'etc/hello.txt', ...flags);
  assert.equal(cat.stdout, 'hello\n');
  // HEAD, footer, TOC and one chunk: a handful of small Range requests, not the 3 MB blob.
  const reads = registry
    .requests()
    .slice(before)
    .filter((r) => r.uri.includes(layer.digest) && r.method === 'GET');
  assert.ok(reads.length >= 3 && reads.length <= 4, `${reads.length} range reads`);
  assert.ok(reads.every((r) => r.status === 206 && r.bytesWritten < layer.size / 4));
  const missing = await starling('estargz', 'cat', `${registry.host}/dst/img@sha256:${'2'.repeat(64)}`, 'x', ...flags);
  assert.equal(missing.code, 2);
  assert.match(missing.stderr, /is not in 127\.0\.0\.1:\d+\/dst\/img/);
});

test('convert refuses conflicting flags before touching a registry', async () => {
  const res = await starling('convert', 'a.example/x:1', 'a.example/y:1', '--platform', 'linux/amd64', '--all-platforms');
  assert.equal(res.code, 2);
  assert.match(res.stderr, /exclude each other/);
  const lvl = await starling('convert', 'a.example/x:1', 'a.example/y:1', '--zstd', '--level', '30');
  assert.equal(lvl.code, 2);
  assert.match(lvl.stderr, /--level must be an integer from 1 to 19/);
  assert.ok(existsSync(MAIN));
});
