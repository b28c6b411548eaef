// `starling optimize` end to end: a real docker-registry, an image built with umoci (busybox + two
// layers of small files), the workload run in the sandbox over lazily mounted layers, the record
// file, the optimized image's TOCs and a lazy mount of it that prefetches the recorded files.
// Also the record round-tripping through `starling convert --record-in`, bad input, and Ctrl-C.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { openEstargz, registryBlobSource, TOC_DIGEST_ANNOTATION, type EstargzReader } from '../../src/estargz/index.js';
import { HttpRangeSource, mountLazyLayer } from '../../src/lazy/index.js';
import { RegistryClient } from '../../src/oci/client.js';
import { RegistryHosts } from '../../src/oci/registry-hosts.js';
import { resolveUser } from '../../src/optimize/index.js';
import { startContainerd, writeHostsToml } from '../fixtures/containerd.js';
import { buildImage, imageInfo, pushImage } from '../fixtures/images.js';
import { makeTempDir, mountsUnder, run, waitFor, type TempDir } from '../fixtures/processes.js';
import { startRegistry, type Registry } from '../fixtures/registry.js';
import { itemAt } from '../../src/common/indexing.js';
import { entryOf } from '../estargz/helpers.js';

const MAIN = path.resolve(import.meta.dirname, '../../src/cli/main.ts');
// The pause after the reads: ctr-remote stops its fanotify monitor when the container exits, and on
// a busy machine the last reads' events were then lost (its record held only bin/busybox).
const WORKLOAD = '["sh","-c","cat /data/a /data/c; sleep 1"]';

let registry: Registry;
let tmp: TempDir;
let client: RegistryClient;
let srcRef: string;
let srcDigest: string;
/** The main run, shared by the tests that inspect it. */
let optimized: { code: number | null; stdout: string; stderr: string; recordFile: string };

function starling(args: string[], timeoutMs = 120_000) {
  return run(process.execPath, ['--import', 'tsx', MAIN, ...args], { timeoutMs });
}

/** A dir of its own for each run's --tmp-dir: after the run it must be empty and hold no mount. */
async function workDir(name: string): Promise<string> {
  const dir = path.join(tmp.path, `work-${name}`);
  await fsp.mkdir(dir);
  return dir;
}

async function assertCleanedUp(dir: string): Promise<void> {
  assert.deepEqual(mountsUnder(dir), [], `no mount left under ${dir}`);
  assert.deepEqual(await fsp.readdir(dir), [], `${dir} is empty again`);
}

async function readers(repo: string, tag: string): Promise<EstargzReader[]> {
  const { manifest } = await imageInfo(registry.host, `${repo}:${tag}`);
  const out: EstargzReader[] = [];
  for (const layer of manifest.layers) {
    const tocDigest = layer.annotations?.[TOC_DIGEST_ANNOTATION];
    assert.ok(tocDigest, `${repo}:${tag} layer ${layer.digest} has a TOC digest`);
    out.push(await openEstargz(await registryBlobSource(client, repo, layer.digest), { tocDigest }));
  }
  return out;
}

/** Names of the TOC's regular files before and after the prefetch landmark. */
function split(reader: EstargzReader | undefined): { before: string[]; after: string[]; landmark: boolean } {
  assert.ok(reader, 'the image has that layer');
  const names = reader.entries.map((e) => e.name);
  const at = names.indexOf('.prefetch.landmark');
  const regular = (list: string[]) => list.filter((n) => reader.lookup(n)?.type === 'reg' && !n.endsWith('landmark'));
  if (at < 0) return { before: [], after: regular(names), landmark: false };
  return { before: regular(names.slice(0, at)), after: regular(names.slice(at + 1)), landmark: true };
}

before(async () => {
  tmp = await makeTempDir('starling-optimize-test-');
  registry = await startRegistry({ host: '127.0.4.1' });
  client = new RegistryClient(registry.host, { hosts: new RegistryHosts([registry.host]) });
  const image = await buildImage({
    withBusybox: true,
    layers: [
      { files: { '/data/a': 'alpha\n', '/data/b': 'bravo\n', '/data/c': 'charlie, layer 1\n' } },
      // The second layer shadows /data/c: the read is served by (and recorded for) this layer.
      { files: { '/data/c': 'charlie, layer 2\n', '/data/e': 'echo\n' } },
    ],
  });
  const pushed = await pushImage(image.layoutDir, image.tag, registry.host, 'src/opt:v1');
  srcRef = pushed.ref;
  srcDigest = pushed.digest;
  const recordFile = path.join(tmp.path, 'record.jsonl');
  const res = await starling([
    'optimize',
    srcRef,
    `${registry.host}/dst/opt:optimized`,
    '--insecure-registry',
    registry.host,
    '--entrypoint',
    WORKLOAD,
    '--args',
    '[]',
    '--record-out',
    recordFile,
    '--tmp-dir',
    await workDir('main'),
  ]);
  optimized = { ...res, recordFile };
});

after(async () => {
  await client?.close();
  await registry?.stop();
  await tmp?.remove();
});

test('the workload runs and its output comes through; the command prints the new manifest digest', async () => {
  assert.equal(optimized.code, 0, optimized.stderr);
  assert.match(optimized.stderr, /alpha\ncharlie, layer 2\n/);
  assert.equal(optimized.stdout.trim(), (await imageInfo(registry.host, 'dst/opt:optimized')).digest);
  await assertCleanedUp(path.join(tmp.path, 'work-main'));
});

test("the record lists the files read, in order, with the layer that served each, in ctr-remote's format", async () => {
  const lines = (await fsp.readFile(optimized.recordFile, 'utf8')).trim().split('\n');
  assert.deepEqual(
    lines.map((l) => JSON.parse(l)),
    [
      { path: 'bin/busybox', manifestDigest: srcDigest, layerIndex: 0 }, // sh and cat are busybox
      { path: 'data/a', manifestDigest: srcDigest, layerIndex: 1 },
      { path: 'data/c', manifestDigest: srcDigest, layerIndex: 2 },
    ],
  );
  // Exactly the byte layout Go's json.Encoder writes for recorder.Entry.
  assert.equal(lines[1], `{"path":"data/a","manifestDigest":"${srcDigest}","layerIndex":1}`);
});

test('the optimized TOCs hold the recorded files before the landmark and the others after', async () => {
  const [busybox, one, two] = await readers('dst/opt', 'optimized');
  assert.deepEqual(split(busybox).before, ['bin/busybox']);
  assert.deepEqual(split(one), { before: ['data/a'], after: ['data/b', 'data/c'], landmark: true });
  assert.deepEqual(split(two), { before: ['data/c'], after: ['data/e'], landmark: true });
});

test('a lazy mount of the optimized layer prefetches the recorded file and nothing else', async () => {
  const { manifest } = await imageInfo(registry.host, 'dst/opt:optimized');
  const layer = manifest.layers[1];
  const tocDigest = layer?.annotations?.[TOC_DIGEST_ANNOTATION];
  assert.ok(layer && tocDigest, 'the optimized image has a second layer with a TOC digest');
  const source = await HttpRangeSource.open(`${registry.url}/v2/dst/opt/blobs/${layer.digest}`);
  const mountpoint = path.join(tmp.path, 'mnt');
  await fsp.mkdir(mountpoint);
  const lazy = await mountLazyLayer({
    source,
    tocDigest,
    mountpoint,
    cacheDir: path.join(tmp.path, 'cache'),
    backgroundFetch: { enabled: false },
  });
  try {
    const stats = lazy.stats();
    assert.equal(stats.prefetch.chunks, 1, 'data/a (one chunk) was prefetched');
    const chunkOf = (name: string) => itemAt(entryOf(lazy.reader, name).chunks, 0).digest;
    const store = fs.readdirSync(path.join(tmp.path, 'cache', 'sha256'), { recursive: true }).map(String);
    assert.ok(
      store.some((f) => f.endsWith(chunkOf('data/a').slice(7))),
      'data/a is in the cache',
    );
    assert.ok(!store.some((f) => f.endsWith(chunkOf('data/b').slice(7))), 'data/b is not');
    const fetched = stats.bytesFetched;
    const cat = await run('cat', [path.join(mountpoint, 'data/a')]); // in a child: never read our own mount here
    assert.equal(cat.stdout, 'alpha\n');
    assert.equal(lazy.stats().bytesFetched, fetched, 'reading the prefetched file fetched nothing more');
    const catB = await run('cat', [path.join(mountpoint, 'data/b')]);
    assert.equal(catB.stdout, 'bravo\n');
    assert.ok(lazy.stats().bytesFetched > fetched, 'data/b was fetched on demand');
  } finally {
    await lazy.unmount();
    await source.close();
  }
});

test('the record round-trips through `starling convert --record-in` to the same image', async () => {
  const res = await starling([
    'convert',
    srcRef,
    `${registry.host}/dst/opt:from-record`,
    '--insecure-registry',
    registry.host,
    '--record-in',
    optimized.recordFile,
  ]);
  assert.equal(res.code, 0, res.stderr);
  const a = await imageInfo(registry.host, 'dst/opt:optimized');
  const b = await imageInfo(registry.host, 'dst/opt:from-record');
  assert.deepEqual(b.layers, a.layers, 'same layer blobs');
  assert.equal(b.digest, a.digest, 'same manifest');
});

test('ctr-remote image optimize records the same files; its record converts to the same image', async () => {
  const containerd = await startContainerd();
  try {
    await writeHostsToml(containerd.hostsDir, registry.host);
    await containerd.pull(srcRef);
    const record = path.join(tmp.path, 'ctr-remote.jsonl');
    const res = await run(
      'ctr-remote',
      [
        '--address',
        containerd.address,
        '--namespace',
        'default',
        'image',
        'optimize',
        '--oci',
        '--record-out',
        record,
        '--entrypoint',
        WORKLOAD,
        '--args',
        '[]',
        srcRef,
        `${registry.host}/ref/opt:optimized`,
      ],
      { timeoutMs: 120_000 },
    );
    // ctr-remote 0.12 writes the record, then its own conversion refuses umoci's second layer (no
    // entry for the parent dir "data": "failed to sort tar entries"); only the record is used here.
    assert.ok(fs.existsSync(record), `ctr-remote wrote its record\n${res.stderr}`);
    const theirs = (await fsp.readFile(record, 'utf8')).trim().split('\n');
    const ours = (await fsp.readFile(optimized.recordFile, 'utf8')).trim().split('\n');
    assert.deepEqual([...new Set(theirs)], ours, 'fanotify saw the same files in the same order (it repeats a file per event)');
    const conv = await starling([
      'convert',
      srcRef,
      `${registry.host}/dst/opt:from-ctr-remote`,
      '--insecure-registry',
      registry.host,
      '--record-in',
      record,
    ]);
    assert.equal(conv.code, 0, conv.stderr);
    assert.equal(
      (await imageInfo(registry.host, 'dst/opt:from-ctr-remote')).digest,
      (await imageInfo(registry.host, 'dst/opt:optimized')).digest,
    );
  } finally {
    await containerd.stop();
  }
});

test('an eStargz source is rebuilt with the recorded files first (kept layers would lose the order)', async () => {
  const unoptimized = `${registry.host}/dst/opt:plain-esgz`;
  const conv = await starling(['convert', srcRef, unoptimized, '--insecure-registry', registry.host]);
  assert.equal(conv.code, 0, conv.stderr);
  assert.equal(split((await readers('dst/opt', 'plain-esgz'))[1]).landmark, false);
  const dir = await workDir('esgz');
  const res = await starling([
    'optimize',
    unoptimized,
    `${registry.host}/dst/opt:esgz-optimized`,
    '--insecure-registry',
    registry.host,
    '--entrypoint',
    WORKLOAD,
    '--tmp-dir',
    dir,
  ]);
  assert.equal(res.code, 0, res.stderr);
  const [, one, two] = await readers('dst/opt', 'esgz-optimized');
  assert.deepEqual(split(one).before, ['data/a']);
  assert.deepEqual(split(two).before, ['data/c']);
  await assertCleanedUp(dir);
});

test('the period stops a workload that does not exit; what it read so far is recorded', async () => {
  const dir = await workDir('period');
  const record = path.join(tmp.path, 'period.jsonl');
  const started = Date.now();
  const res = await starling([
    'optimize',
    srcRef,
    `${registry.host}/dst/opt:period`,
    '--insecure-registry',
    registry.host,
    '--entrypoint',
    '["sh","-c","cat /data/e; sleep 7777"]',
    '--period',
    '2',
    '--record-out',
    record,
    '--tmp-dir',
    dir,
  ]);
  assert.equal(res.code, 0, res.stderr);
  assert.match(res.stderr, /stopped after 2 s/);
  assert.ok(Date.now() - started < 60_000);
  const paths = (await fsp.readFile(record, 'utf8'))
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l).path);
  assert.deepEqual(paths, ['bin/busybox', 'data/e']);
  assert.equal(sleepers('7777').length, 0, "the workload's children are gone");
  await assertCleanedUp(dir);
});

/** Pids of processes running `sleep <arg>` (busybox or coreutils). */
function sleepers(arg: string): number[] {
  const out: number[] = [];
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const argv = fs.readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
      if (argv[0]?.endsWith('sleep') && argv[1] === arg) out.push(Number(entry));
    } catch {
      // gone
    }
  }
  return out;
}

test('bad input gets a clear error and leaves nothing behind', async () => {
  const dst = `${registry.host}/dst/opt:bad`;
  const common = ['--insecure-registry', registry.host];
  const cases: Array<{ name: string; args: string[]; message: RegExp }> = [
    {
      name: 'json',
      args: ['optimize', srcRef, dst, ...common, '--entrypoint', '["sh", -c]'],
      message: /--entrypoint must be a JSON array of strings/,
    },
    {
      name: 'notarray',
      args: ['optimize', srcRef, dst, ...common, '--args', '{"a":1}'],
      message: /--args must be a JSON array of strings/,
    },
    { name: 'period', args: ['optimize', srcRef, dst, ...common, '--period', 'soon'], message: /--period must be a number of seconds/ },
    {
      name: 'missing-image',
      args: ['optimize', `${registry.host}/no/such:image`, dst, ...common],
      message: /no\/such.*(MANIFEST_UNKNOWN|NAME_UNKNOWN|404|not found)/i,
    },
    {
      name: 'missing-binary',
      args: ['optimize', srcRef, dst, ...common, '--entrypoint', '["/usr/bin/python3","-V"]'],
      message: /command "\/usr\/bin\/python3" cannot be run in the image: No such file or directory/,
    },
    {
      name: 'missing-in-path',
      args: ['optimize', srcRef, dst, ...common, '--entrypoint', '["python3"]'],
      message: /command "python3" cannot be run in the image/,
    },
    {
      name: 'cwd',
      args: ['optimize', srcRef, dst, ...common, '--entrypoint', WORKLOAD, '--cwd', '/nowhere'],
      message: /working directory \/nowhere is not usable/,
    },
    {
      name: 'user',
      args: ['optimize', srcRef, dst, ...common, '--entrypoint', WORKLOAD, '--user', 'nobody'],
      message: /user "nobody" is not in the image's \/etc\/passwd/,
    },
  ];
  for (const c of cases) {
    const dir = await workDir(`bad-${c.name}`);
    const res = await starling([...c.args, '--tmp-dir', dir]);
    assert.equal(res.code, 2, `${c.name}: exit code 2 (a user error)\n${res.stderr}`);
    assert.match(res.stderr, c.message, c.name);
    assert.doesNotMatch(res.stderr, /\n\s+at /, `${c.name}: no stack trace`);
    await assertCleanedUp(dir);
  }
  assert.equal(
    (await run('curl', ['-s', '-o', '/dev/null', '-w', '%{http_code}', `${registry.url}/v2/dst/opt/manifests/bad`])).stdout,
    '404',
    'no DST tag written',
  );
});

test('Ctrl-C during the run kills the workload, unmounts and removes the work dir', async () => {
  const dir = await workDir('sigint');
  const child = spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      MAIN,
      'optimize',
      srcRef,
      `${registry.host}/dst/opt:sigint`,
      '--insecure-registry',
      registry.host,
      '--entrypoint',
      '["sh","-c","cat /data/a; sleep 8888"]',
      '--period',
      '300',
      '--tmp-dir',
      dir,
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  try {
    await waitFor(() => sleepers('8888').length > 0, 90_000, 'the workload to start');
    assert.ok(mountsUnder(dir).length >= 3, 'the layers are mounted while the workload runs');
    const signalled = Date.now();
    child.kill('SIGINT');
    const code = await exited;
    assert.equal(code, 130, stderr);
    assert.ok(Date.now() - signalled < 15_000, 'stopped promptly');
    assert.match(stderr, /SIGINT: stopping the workload and cleaning up/);
    assert.equal(sleepers('8888').length, 0, 'the workload is gone');
    await assertCleanedUp(dir);
    assert.equal(
      (await run('curl', ['-s', '-o', '/dev/null', '-w', '%{http_code}', `${registry.url}/v2/dst/opt/manifests/sigint`])).stdout,
      '404',
    );
  } finally {
    child.kill('SIGKILL');
  }
});

test("users resolve from the image's passwd and group files as runc does", async () => {
  const files: Record<string, string> = {
    'etc/passwd': 'root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n',
    'etc/group': 'root:x:0:\nstaff:x:50:\n',
  };
  const read = async (name: string) => files[name];
  assert.deepEqual(await resolveUser('', read), { uid: 0, gid: 0 });
  assert.deepEqual(await resolveUser('app', read), { uid: 1000, gid: 1001 });
  assert.deepEqual(await resolveUser('app:staff', read), { uid: 1000, gid: 50 });
  assert.deepEqual(await resolveUser('1000', read), { uid: 1000, gid: 1001 });
  assert.deepEqual(await resolveUser('4242', read), { uid: 4242, gid: 0 });
  assert.deepEqual(await resolveUser('4242:7', read), { uid: 4242, gid: 7 });
  await assert.rejects(resolveUser('ghost', read), /user "ghost" is not in the image's \/etc\/passwd/);
  await assert.rejects(resolveUser('app:ghosts', read), /group "ghosts" is not in the image's \/etc\/group/);
  await assert.rejects(resolveUser('a:b:c', read), /must be user\[:group\]/);
});
