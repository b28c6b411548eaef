// The snapshotter behind a real containerd 1.6 (`[proxy_plugins.starling]`), with a real
// `starling peer` as the mirror and a real registry: Debian's ctr-remote rpull of eStargz images
// (converted by Starling and by ctr-remote), ctr run on the lazily mounted layers, a corrupt
// chunk, a kill -9 of the snapshotter under a running container, and Remove/Cleanup.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { request } from 'undici';
import { fuseMountHealth } from '../../src/fuse/index.js';
import { TOC_DIGEST_ANNOTATION, UNCOMPRESSED_SIZE_ANNOTATION } from '../../src/estargz/index.js';
import { MediaType } from '../../src/oci/media-types.js';
import { startContainerd, writeHostsToml, type Containerd } from '../fixtures/containerd.js';
import { buildImage, imageInfo, pushImage, uploadBlobFile, type BuiltImage } from '../fixtures/images.js';
import { startPeer, STARLING_CLI, type RunningPeerProcess } from '../fixtures/peer.js';
import { makeTempDir, run, waitFor, type TempDir } from '../fixtures/processes.js';
import { blobBytesSent, startRegistry, type Registry } from '../fixtures/registry.js';
import { buildLayer, corruptChunkCopy, layerEntries } from '../lazy/layer-fixture.js';
import { makeTar } from '../fixtures/tar.js';
import { proxyPluginConfig, startSnapshotterProcess, type SnapshotterProcess } from '../fixtures/snapshotter.js';
import { fuseMountsUnder } from './helpers.js';
import { itemAt } from '../../src/common/indexing.js';
import { entryOf } from '../estargz/helpers.js';

const MiB = 1 << 20;
const CHUNK = MiB;
const LAYER_FILE = 10 * MiB; // 3 peer pieces of 4 MiB: a range read need not bring the whole blob
const CONFIG = 'backgroundFetch:\n  enabled: false\n'; // so every byte fetched is one a read asked for

interface Layer {
  digest: string;
  size: number;
}

describe('starling snapshotter behind containerd', () => {
  let tmp: TempDir;
  let registry: Registry;
  let peer: RunningPeerProcess;
  let containerd: Containerd;
  let sn: SnapshotterProcess;
  let image: BuiltImage;
  let busyboxSha: string;
  let counter = 0;
  const refs = { starling: '', ctrRemote: '', plain: '' };

  const ctrRemote = (args: string[]) =>
    run('ctr-remote', ['--address', containerd.address, '--namespace', 'default', ...args], { timeoutMs: 180_000 });
  const rpull = async (ref: string) => {
    const res = await ctrRemote(['images', 'rpull', '--snapshotter', 'starling', '--plain-http', '--hosts-dir', containerd.hostsDir, ref]);
    assert.equal(res.code, 0, `rpull ${ref}: ${res.stderr}${res.stdout}\n${sn.service.logTail(30)}`);
  };
  const runIn = (ref: string, script: string) =>
    containerd.ctr(['run', '--rm', '--snapshotter', 'starling', ref, `sn-${process.pid}-${++counter}`, 'sh', '-c', script], {
      timeoutMs: 120_000,
    });
  const layersOf = async (ref: string): Promise<Layer[]> => (await imageInfo(registry.host, ref.slice(registry.host.length + 1))).layers;
  const contentDigests = async () => (await containerd.ctr(['content', 'ls', '-q'])).stdout.split('\n').filter(Boolean);
  /** The script reads a file from every layer: busybox, a small file of layer 1, the big chunked file of layer 2. */
  const SCRIPT = 'sha256sum /bin/busybox /etc/one.txt /data/layer1.bin';
  const expectedSums = () => [busyboxSha, sha('one\n'), itemAt(image.randomFiles, 1).sha256];
  /** The digests the workload printed, one `sha256sum` line per file. */
  const printedSums = (stdout: string) =>
    stdout
      .trim()
      .split('\n')
      .map((line) => line.split(/\s+/)[0]);

  before(async () => {
    tmp = await makeTempDir('starling-sn-e2e-');
    registry = await startRegistry();
    peer = await startPeer({ insecure: [registry.host] });
    sn = await startSnapshotterProcess({ dir: tmp.path, peerUrl: peer.url, configYaml: CONFIG });
    containerd = await startContainerd({ extraConfig: proxyPluginConfig(sn.socket) });
    await writeHostsToml(containerd.hostsDir, registry.host, peer.url);
    busyboxSha = createHash('sha256')
      .update(await fsp.readFile('/bin/busybox'))
      .digest('hex');
    image = await buildImage({
      withBusybox: true,
      layers: [
        { sizeBytes: LAYER_FILE, seed: 'sn-layer-0', files: { '/etc/one.txt': 'one\n' } },
        { sizeBytes: LAYER_FILE, seed: 'sn-layer-1', files: { '/etc/two.txt': 'two\n' } },
      ],
    });
    await pushImage(image.layoutDir, image.tag, registry.host, 'src/img:v1');
    refs.plain = `${registry.host}/src/img:v1`;
    refs.starling = `${registry.host}/snap/img:esgz`;
    const conv = await run(process.execPath, [
      STARLING_CLI,
      'convert',
      refs.plain,
      refs.starling,
      '--insecure-registry',
      registry.host,
      '--chunk-size',
      String(CHUNK),
    ]);
    assert.equal(conv.code, 0, conv.stderr);
    // ctr-remote converts inside containerd's content store: pull the original there (default snapshotter), convert, push.
    refs.ctrRemote = `${registry.host}/ref/img:esgz`;
    await containerd.pull(refs.plain);
    const rc = await ctrRemote([
      'images',
      'convert',
      '--estargz',
      '--oci',
      '--estargz-chunk-size',
      String(CHUNK),
      refs.plain,
      refs.ctrRemote,
    ]);
    assert.equal(rc.code, 0, rc.stderr);
    const push = await containerd.ctr(['images', 'push', '--plain-http', refs.ctrRemote]);
    assert.equal(push.code, 0, push.stderr);
    // Forget the local copies: the lazy pulls below must start from nothing.
    await containerd.ctr(['images', 'rm', '--sync', refs.plain, refs.ctrRemote]);
  });

  after(async () => {
    await containerd?.stop();
    await sn?.stop();
    await peer?.stop();
    await registry?.stop();
    await tmp?.remove();
  });

  /** rpull, then checks no layer came whole (snapshotter metric, registry log, containerd's content store). */
  async function lazyPull(ref: string): Promise<{ layers: Layer[]; report: string[] }> {
    const layers = await layersOf(ref);
    await rpull(ref);
    const content = await contentDigests();
    const report: string[] = [];
    for (const [i, layer] of layers.entries()) {
      assert.ok(!content.includes(layer.digest), `layer ${i} was not downloaded into containerd's content store`);
      const fetched = await sn.metric('starling_snapshotter_layer_fetched_bytes', layer.digest);
      const origin = blobBytesSent(registry.requests(), layer.digest);
      assert.ok(fetched > 0 && fetched < layer.size, `layer ${i}: fetched ${fetched} of ${layer.size} through the peer`);
      if (layer.size > 8 * MiB) assert.ok(origin < layer.size, `layer ${i}: registry sent ${origin} of ${layer.size}`);
      report.push(`layer ${i}: ${layer.size} B, after rpull fetched ${fetched} B via peer, registry sent ${origin} B`);
    }
    return { layers, report };
  }

  async function runAndCheck(ref: string, layers: Layer[], report: string[]): Promise<void> {
    const res = await runIn(ref, SCRIPT);
    assert.equal(res.code, 0, `${res.stderr}\n${sn.service.logTail(20)}`);
    assert.deepEqual(printedSums(res.stdout), expectedSums());
    // Layer 1 was read for one small file: still far from whole.
    const layer1 = itemAt(layers, 1);
    const fetched1 = await sn.metric('starling_snapshotter_layer_fetched_bytes', layer1.digest);
    assert.ok(fetched1 < layer1.size / 2, `layer 1 after the run: ${fetched1} of ${layer1.size}`);
    for (const [i, layer] of layers.entries()) {
      report.push(
        `layer ${i}: after the run fetched ${await sn.metric('starling_snapshotter_layer_fetched_bytes', layer.digest)} B, registry sent ${blobBytesSent(registry.requests(), layer.digest)} B`,
      );
    }
    console.log(`# ${ref}\n# ${report.join('\n# ')}`);
  }

  test('(a) an image converted by starling convert: rpull downloads no whole layer; ctr run reads every layer correctly', async () => {
    const { layers, report } = await lazyPull(refs.starling);
    await runAndCheck(refs.starling, layers, report);
  });

  test('(a) an image converted by ctr-remote images convert --estargz --oci: same', async () => {
    const { layers, report } = await lazyPull(refs.ctrRemote);
    await runAndCheck(refs.ctrRemote, layers, report);
  });

  test('a layer that is not eStargz falls back to an ordinary overlay snapshot', async () => {
    await rpull(refs.plain);
    const content = await contentDigests();
    for (const layer of await layersOf(refs.plain)) assert.ok(content.includes(layer.digest), 'containerd downloaded and unpacked it');
    const res = await runIn(refs.plain, SCRIPT);
    assert.equal(res.code, 0, res.stderr);
    assert.deepEqual(printedSums(res.stdout), expectedSums());
  });

  test('(b) a corrupt chunk in the registry: that file fails with EIO in the container, the others read fine', async () => {
    const dir = path.join(tmp.path, 'corrupt');
    await fsp.mkdir(dir);
    const stored = await buildLayer(dir, 'stored', await makeTar(layerEntries(2 * MiB)), 0);
    try {
      const corruptFile = path.join(dir, 'corrupt.estargz');
      const corrupt = await corruptChunkCopy(stored, 'x/attrs', corruptFile);
      const ref = await pushWithLayer(refs.starling, 'corrupt', corruptFile, corrupt, stored.result);
      await rpull(ref);
      const bad = await runIn(ref, 'cat /x/attrs');
      assert.notEqual(bad.code, 0, 'reading the corrupt file fails');
      assert.match(bad.stderr + bad.stdout, /I\/O error|Input\/output error/);
      assert.ok(!bad.stdout.includes('xattrs'), 'no byte of the corrupt chunk is served');
      const good = await runIn(ref, 'cat /data/small.txt /implicit/sub/file.txt && sha256sum /data/multi.bin');
      assert.equal(good.code, 0, good.stderr);
      const multi = entryOf(stored.reader, 'data/multi.bin').digest.slice(7);
      assert.equal(good.stdout, `hello lazy layer\nparents not in the tar\n${multi}  /data/multi.bin\n`);
      assert.ok((await sn.metric('starling_snapshotter_layer_digest_mismatches', corrupt.digest)) >= 1);
    } finally {
      await stored.close();
    }
  });

  /** Runs `sleep 600` in a container of `ref` and calls `body` with its id; removes it afterwards. */
  async function withRunningContainer(ref: string, body: (id: string) => Promise<void>): Promise<void> {
    const id = `hold-${process.pid}-${++counter}`;
    const started = await containerd.ctr(['run', '-d', '--snapshotter', 'starling', ref, id, 'sleep', '600']);
    assert.equal(started.code, 0, started.stderr);
    try {
      await waitFor(async () => (await containerd.ctr(['tasks', 'ls'])).stdout.includes(id), 20_000, 'task running');
      await body(id);
    } finally {
      await containerd.ctr(['tasks', 'kill', '--signal', 'SIGKILL', id]);
      await waitFor(
        async () =>
          (await containerd.ctr(['tasks', 'delete', id])).code === 0 || !(await containerd.ctr(['tasks', 'ls'])).stdout.includes(id),
        20_000,
        'task deleted',
      );
      await containerd.ctr(['containers', 'delete', id]);
    }
  }
  const execIn = (id: string, cmd: string[]) =>
    containerd.ctr(['tasks', 'exec', '--exec-id', `probe-${++counter}`, id, ...cmd], { timeoutMs: 30_000 });
  const reconnected = () =>
    waitFor(
      async () => (await containerd.ctr(['snapshots', '--snapshotter', 'starling', 'ls'])).code === 0,
      30_000,
      'containerd reconnected',
    );

  test('(c) the snapshotter killed -9 and restarted under a running container: its files stay readable throughout', async () => {
    await withRunningContainer(refs.starling, async (id) => {
      const mounted = fuseMountsUnder(sn.root);
      assert.ok(mounted.length >= 3, `remote layers mounted: ${mounted.join(', ')}`);
      const server = sn.fuseServerPid();
      assert.ok(server, 'a FUSE server serves the mounts');
      await sn.service.kill9();
      for (const m of mounted) assert.equal(await fuseMountHealth(m), 'alive', `${m} still answers while the snapshotter is down`);
      // A file of the top layer nobody has read yet: fetched now, through the peer, by the FUSE server.
      const whileDown = await execIn(id, ['cat', '/etc/two.txt']);
      assert.equal(whileDown.stdout, 'two\n', `read while the snapshotter is down: ${whileDown.stderr}`);

      sn = await sn.restart();
      await reconnected();
      assert.equal(sn.fuseServerPid(), server, 'the restarted snapshotter found the same FUSE server');
      assert.deepEqual(fuseMountsUnder(sn.root).sort(), mounted.sort(), 'the same mounts, not new ones');
      const afterRestart = await execIn(id, ['sha256sum', '/data/layer1.bin']);
      assert.equal(afterRestart.code, 0, afterRestart.stderr);
      assert.equal(afterRestart.stdout.split(/\s+/)[0], itemAt(image.randomFiles, 1).sha256);
      const res = await runIn(refs.starling, SCRIPT);
      assert.equal(res.code, 0, `${res.stderr}\n${sn.service.logTail(20)}`);
      assert.deepEqual(printedSums(res.stdout), expectedSums());
    });
  });

  test('(c) the FUSE server killed -9 too: the restart leaves no stuck mount; the image runs again', async () => {
    await withRunningContainer(refs.starling, async (id) => {
      const mounted = fuseMountsUnder(sn.root);
      assert.ok(mounted.length >= 3, `remote layers mounted: ${mounted.join(', ')}`);
      await sn.service.kill9();
      const fuseServer = sn.fuseServerPid();
      assert.ok(fuseServer, 'the FUSE server runs apart from the snapshotter');
      process.kill(fuseServer, 'SIGKILL');
      await waitFor(
        async () => (await Promise.all(mounted.map(fuseMountHealth))).every((h) => h === 'dead'),
        10_000,
        'mounts dead without their server',
      );

      sn = await sn.restart();
      await reconnected();
      const after = fuseMountsUnder(sn.root);
      assert.deepEqual(after.sort(), mounted.sort(), 'the same layers are mounted again');
      for (const m of after) assert.equal(await fuseMountHealth(m), 'alive', `${m} answers`);
      const res = await runIn(refs.starling, SCRIPT);
      assert.equal(res.code, 0, `${res.stderr}\n${sn.service.logTail(20)}`);
      assert.deepEqual(printedSums(res.stdout), expectedSums());
      // The old container's overlay still holds the superblocks of the killed FUSE sessions: report what it sees.
      const old = await execIn(id, ['cat', '/etc/two.txt']);
      console.log(
        `# after losing its FUSE server, the container started before reads a not-yet-read file: code ${old.code} ${old.stdout.trim()} ${old.stderr.trim()}`,
      );
    });
  });

  test("(d) removing the images: containerd's GC calls Remove and Cleanup; mounts and disk are freed", async () => {
    const snapshots = path.join(sn.root, 'snapshots');
    const before = await duBytes(snapshots);
    assert.ok(before > MiB, `chunk caches and unpacked layers use disk: ${before}`);
    assert.ok(fuseMountsUnder(sn.root).length > 0);
    const images = (await containerd.ctr(['images', 'ls', '-q'])).stdout.split('\n').filter(Boolean);
    const rm = await containerd.ctr(['images', 'rm', '--sync', ...images]);
    assert.equal(rm.code, 0, rm.stderr);
    await waitFor(async () => (await fsp.readdir(snapshots)).length === 0, 30_000, 'every snapshot dir removed');
    assert.deepEqual(fuseMountsUnder(sn.root), []);
    assert.ok((await duBytes(snapshots)) < 64 * 1024, 'disk freed');
    const meta = JSON.parse(await fsp.readFile(path.join(sn.root, 'metadata.json'), 'utf8'));
    assert.deepEqual(meta.snapshots, {});
  });

  /** A copy of `baseRef`'s manifest whose layers are its first (busybox) plus `file` (an eStargz blob), pushed as `tag`. */
  async function pushWithLayer(
    baseRef: string,
    tag: string,
    file: string,
    blob: Layer,
    built: { tocDigest: string; diffID: string; uncompressedSize: number },
  ): Promise<string> {
    const repo = 'snap/img';
    const base = await imageInfo(registry.host, `${repo}:${baseRef.split(':').pop()}`);
    const config = (await (await request(`${registry.url}/v2/${repo}/blobs/${base.config.digest}`)).body.json()) as any;
    config.rootfs.diff_ids = [config.rootfs.diff_ids[0], built.diffID];
    delete config.history;
    const configFile = path.join(path.dirname(file), 'config.json');
    const configBytes = Buffer.from(JSON.stringify(config));
    await fsp.writeFile(configFile, configBytes);
    const configDigest = `sha256:${createHash('sha256').update(configBytes).digest('hex')}`;
    await uploadBlobFile(registry, repo, configFile, configDigest, configBytes.length);
    await uploadBlobFile(registry, repo, file, blob.digest, blob.size);
    const manifest = {
      schemaVersion: 2,
      mediaType: MediaType.OciManifest,
      config: { mediaType: MediaType.OciConfig, digest: configDigest, size: configBytes.length },
      layers: [
        base.manifest.layers[0],
        {
          mediaType: MediaType.OciLayerGzip,
          digest: blob.digest,
          size: blob.size,
          annotations: { [TOC_DIGEST_ANNOTATION]: built.tocDigest, [UNCOMPRESSED_SIZE_ANNOTATION]: String(built.uncompressedSize) },
        },
      ],
    };
    const put = await request(`${registry.url}/v2/${repo}/manifests/${tag}`, {
      method: 'PUT',
      headers: { 'content-type': MediaType.OciManifest },
      body: JSON.stringify(manifest),
    });
    assert.equal(put.statusCode, 201, await put.body.text());
    return `${registry.host}/${repo}:${tag}`;
  }
});

function sha(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}

async function duBytes(dir: string): Promise<number> {
  const res = await run('du', ['-sb', '-x', dir]);
  return Number(res.stdout.split(/\s+/)[0]);
}
