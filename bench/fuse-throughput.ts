// FUSE read throughput of a lazily mounted eStargz layer whose chunks are all in the local chunk
// cache, against the same file on local disk: a sequential read of a 256 MB file (random bytes,
// 4 MiB chunks) with `dd bs=1M`, in a child process (the mount is served by this process's JS
// thread, which must never read its own mount).
//
//   npx tsx bench/fuse-throughput.ts [--size 256MiB] [--runs 3] [--bs 1M] [--chunk-size 4194304] [--max-read BYTES] [--read-ahead KIB] [--no-memory-cache] [--compare-baseline] [--ceiling]
//   (--compare-baseline: also a second mount with --read-ahead 0 --no-memory-cache, the lazy layer
//    as it was before both, read in the same rounds)
//   (--ceiling: also a FUSE mount of the same addon answering every read with a slice of one 4 MiB
//    buffer in memory: no disk, no allocation, no lazy layer; what FUSE served from JS can reach here)
//
// Cold runs: before each read, the page cache of what that read will touch is evicted file by file
// with POSIX_FADV_DONTNEED (`sync FILE…` then `dd iflag=nocache count=0`), and `fincore` confirms nothing of it stays
// resident: the local file, or the FUSE file (its pages in the mount's own page cache) plus every
// chunk file of the cache (the pages the FUSE server reads from). O_DIRECT is not used: the lazy
// mount serves ordinary buffered opens (direct_io off), which is what a container's reads are, and
// O_DIRECT on the FUSE file would measure another path. The machine's "disk" is a virtio device
// whose host side may cache too: the local figure is what a cold read costs in this VM, the best
// case for the disk, and so the hardest one for the mount to match.
// Warm runs read again without evicting anything (page cache hits on both sides).
import { createReadStream, createWriteStream, readdirSync } from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { writeRandomFile } from '../test/fixtures/images.js';
import { makeTempDir, runOk } from '../test/fixtures/processes.js';
import { buildEstargz, fileSource } from '../src/estargz/index.js';
import { Errno, FuseError, mountFuse, S_IFDIR, S_IFREG, type FuseMount } from '../src/fuse/index.js';
import { mountLazyLayer, setReadAhead, type LazyLayer, type LazyLayerOptions } from '../src/lazy/index.js';
import { parseSize } from '../src/common/units.js';
import { fixed, median, table } from './lib/stats.js';
import { itemAt } from '../src/common/indexing.js';

const { values: flags } = parseArgs({
  options: {
    size: { type: 'string', default: '256MiB' },
    runs: { type: 'string', default: '3' },
    bs: { type: 'string', default: '1M' },
    'chunk-size': { type: 'string', default: String(4 << 20) },
    'max-read': { type: 'string' },
    'read-ahead': { type: 'string' },
    'no-memory-cache': { type: 'boolean', default: false },
    'compare-baseline': { type: 'boolean', default: false },
    ceiling: { type: 'boolean', default: false },
    help: { type: 'boolean', default: false },
  },
});
if (flags.help) {
  console.log(
    'usage: npx tsx bench/fuse-throughput.ts [--size 256MiB] [--runs 3] [--bs 1M] [--chunk-size 4194304] [--max-read BYTES] [--read-ahead KIB] [--no-memory-cache] [--compare-baseline] [--ceiling]',
  );
  process.exit(0);
}
const size = parseSize(flags.size);
const runs = Number(flags.runs);
const chunkSize = Number(flags['chunk-size']);

async function time(fn: () => Promise<unknown>): Promise<number> {
  const start = performance.now();
  await fn();
  return (performance.now() - start) / 1000;
}

/** Evicts the files' pages from the page cache; returns how many pages stayed resident (fincore). */
async function evict(files: string[]): Promise<number> {
  let resident = 0;
  for (let i = 0; i < files.length; i += 64) {
    const batch = files.slice(i, i + 64);
    // Dirty pages (chunk files just written) cannot be dropped: write them back first (fsync).
    await runOk('sh', [
      '-c',
      'sync -- "$@" && for f in "$@"; do dd if="$f" iflag=nocache count=0 status=none || exit 1; done',
      'evict',
      ...batch,
    ]);
    const res = await runOk('fincore', ['--bytes', '--noheadings', '--raw', '--output', 'RES', ...batch]);
    resident += res.stdout
      .split('\n')
      .filter(Boolean)
      .reduce((n, line) => n + Number(line), 0);
  }
  return resident;
}

async function ddRead(file: string): Promise<number> {
  return time(() => runOk('dd', [`if=${file}`, 'of=/dev/null', `bs=${flags.bs}`, 'status=none'], { timeoutMs: 600_000 }));
}

interface Target {
  name: string;
  file: string;
  /** What a cold read must find evicted. */
  evict: string[];
  cold: number[];
  warm: number[];
  cpu: number[];
  layer?: LazyLayer;
}

const work = await makeTempDir('starling-bench-fuse-');
const layers: LazyLayer[] = [];
let ceilingMount: FuseMount | undefined;
try {
  const dataDir = path.join(work.path, 'data');
  const local = path.join(dataDir, 'big.bin');
  const { sha256 } = await writeRandomFile(local, size, `fuse-throughput-${size}`);
  const tar = path.join(work.path, 'layer.tar');
  await runOk('tar', ['-C', dataDir, '-cf', tar, 'big.bin']);
  const blob = path.join(work.path, 'layer.esgz');
  const built = await buildEstargz(createReadStream(tar), createWriteStream(blob), { chunkSize, level: 1 });
  await fsp.rm(tar);

  /** The blob mounted lazily with its own chunk cache, filled completely before measuring. */
  const mount = async (name: string, settings: Pick<LazyLayerOptions, 'readAheadKib' | 'chunkMemory'>): Promise<Target> => {
    const mountpoint = path.join(work.path, `mnt-${name}`);
    const cacheDir = path.join(work.path, `cache-${name}`);
    await fsp.mkdir(mountpoint);
    const layer = await mountLazyLayer({
      source: await fileSource(blob),
      tocDigest: built.tocDigest,
      mountpoint,
      cacheDir,
      prefetch: false,
      backgroundFetch: { enabled: true, idleMs: 0, concurrency: 2 },
      fuse: flags['max-read'] ? { maxRead: Number(flags['max-read']) } : undefined,
      onWarning: (message) => console.error(`warning: ${message}`),
      ...settings,
    });
    layers.push(layer);
    await layer.backgroundDone;
    if (layer.stats().background?.failed) throw new Error(`${name}: background fetch failed for some chunks`);
    const file = path.join(mountpoint, 'big.bin');
    const check = await runOk('sha256sum', [file], { timeoutMs: 600_000 });
    if (check.stdout.split(/\s+/)[0] !== sha256) throw new Error(`${name}: the mounted file does not hash like the original`);
    const chunkFiles = readdirSync(path.join(cacheDir, 'sha256'), { recursive: true, withFileTypes: true })
      .filter((e) => e.isFile())
      .map((e) => path.join(e.parentPath, e.name));
    return { name, file, evict: [file, ...chunkFiles], cold: [], warm: [], cpu: [], layer };
  };

  const targets: Target[] = [{ name: 'local disk', file: local, evict: [local], cold: [], warm: [], cpu: [] }];
  targets.push(
    await mount('lazy mount', {
      readAheadKib: flags['read-ahead'] === undefined ? undefined : Number(flags['read-ahead']),
      chunkMemory: flags['no-memory-cache'] ? null : undefined,
    }),
  );
  // The lazy layer as it was before the memory cache and the raised read-ahead, measured in the same rounds.
  if (flags['compare-baseline']) targets.push(await mount('baseline mount', { readAheadKib: 0, chunkMemory: null }));
  if (flags.ceiling) {
    const mountpoint = path.join(work.path, 'mnt-ceiling');
    await fsp.mkdir(mountpoint);
    const data = Buffer.alloc(4 << 20, 0x5a);
    const attr = (ino: number) => ({
      ino,
      mode: ino === 1 ? S_IFDIR | 0o755 : S_IFREG | 0o644,
      nlink: ino === 1 ? 2 : 1,
      uid: 0,
      gid: 0,
      rdev: 0,
      size: ino === 1 ? 0 : size,
      mtimeSec: 0,
      mtimeNsec: 0,
    });
    ceilingMount = await mountFuse(
      mountpoint,
      {
        lookup: (parent, name) => {
          if (parent !== 1 || name !== 'big.bin') throw new FuseError(Errno.ENOENT);
          return attr(2);
        },
        getattr: (ino) => attr(ino),
        readlink: () => {
          throw new FuseError(Errno.EINVAL);
        },
        open: () => ({ fh: 0 }),
        read: (_ino, _fh, offset, length) => {
          const at = offset % data.length;
          return data.subarray(at, Math.min(data.length, at + Math.min(length, size - offset)));
        },
        readdir: () => [],
      },
      { fsName: 'starling-ceiling', subtype: 'starling-ceiling', keepCache: true, entryTimeout: 60, attrTimeout: 60 },
    );
    await setReadAhead(ceilingMount.mountpoint, flags['read-ahead'] === undefined ? 4096 : Number(flags['read-ahead']) || 128);
    const file = path.join(mountpoint, 'big.bin');
    targets.push({ name: 'memory-only FUSE', file, evict: [file], cold: [], warm: [], cpu: [] });
  }
  const fetchedAfterFill = layers.map((l) => l.stats().bytesFetched);

  let residentAfterEvict = 0;
  for (let i = 0; i < runs; i++) {
    // Rotate the order so that no target always goes first.
    const order = targets.map((_, k) => itemAt(targets, (k + i) % targets.length));
    for (const t of order) {
      residentAfterEvict += await evict(t.evict);
      const cpu = process.cpuUsage();
      t.cold.push(await ddRead(t.file));
      const used = process.cpuUsage(cpu);
      t.cpu.push((used.user + used.system) / 1e6);
      t.warm.push(await ddRead(t.file));
    }
  }
  layers.forEach((l, k) => {
    if (l.stats().bytesFetched !== fetchedAfterFill[k]) throw new Error('a read fetched from the source: the cache was not complete');
  });

  const rate = (seconds: number) => size / 1e6 / seconds;
  const localDisk = itemAt(targets, 0);
  console.log(
    `${(size / 1e6).toFixed(0)} MB file, ${Math.ceil(size / chunkSize)} chunks of ${chunkSize} B, all cached; dd bs=${flags.bs}; ` +
      `${runs} round(s), targets in rotating order, medians; pages left resident after eviction: ${residentAfterEvict} B`,
  );
  console.log(
    table(
      ['target', 'cold MB/s', 'cold ratio to local', 'paired cold ratio', 'warm MB/s', 'warm ratio', 'server CPU s per cold read'],
      targets.map((t) => [
        t.name,
        fixed(rate(median(t.cold)), 0),
        fixed(median(localDisk.cold) / median(t.cold)),
        // Run by run: the local disk's cold read against this target's in the same round.
        t === localDisk ? '-' : fixed(median(t.cold.map((seconds, i) => itemAt(localDisk.cold, i) / seconds))),
        fixed(rate(median(t.warm)), 0),
        fixed(median(localDisk.warm) / median(t.warm)),
        t === localDisk ? '-' : fixed(median(t.cpu)),
      ]),
    ),
  );
  console.log(
    JSON.stringify({
      kind: 'fuse-throughput',
      size,
      chunkSize,
      bs: flags.bs,
      maxRead: flags['max-read'],
      readAheadKib: flags['read-ahead'] ?? 'default',
      memoryCache: !flags['no-memory-cache'],
      runs,
      targets: targets.map(({ name, cold, warm, cpu }) => ({ name, cold, warm, cpu })),
    }),
  );
} finally {
  for (const layer of layers) await layer.unmount({ lazy: true }).catch(() => {});
  await ceilingMount?.unmount({ lazy: true }).catch(() => {});
  await work.remove();
}
