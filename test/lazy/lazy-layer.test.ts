// The lazy eStargz layer file system end to end: a real docker-registry, a real Starling peer
// (the CLI), the blob read through the peer's mirror with HTTP Range requests, the layer
// mounted through the FUSE addon, and every check done by separate processes (stat, ls,
// readlink, getfattr, sha256sum) as a container would see it.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { makedev, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFREG } from '../../src/fuse/index.js';
import type { LazyLayer } from '../../src/lazy/index.js';
import { pieceLayout, piecesCovering, pieceBounds } from '../../src/storage/piece-plan.js';
import { buildLayer, layerEntries, PRIORITIZED, type BuiltLayer } from './layer-fixture.js';
import { makeTar } from '../fixtures/tar.js';
import {
  isMounted,
  mountFromPeer,
  pushBlob,
  registryBytes,
  resolveHardlink,
  sh,
  startEnv,
  stopEnv,
  unmount,
  visibleEntries,
  type Env,
} from './helpers.js';
import { itemAt } from '../../src/common/indexing.js';
import { entryOf } from '../estargz/helpers.js';

const BIG_SIZE = 20 * 1024 * 1024;
const FOOTER_SIZE = 51;
const TYPE_BITS = { dir: S_IFDIR, reg: S_IFREG, symlink: S_IFLNK, char: S_IFCHR, block: S_IFBLK, fifo: S_IFIFO } as const;

describe('lazy eStargz layer mounted through the peer mirror', () => {
  let env: Env;
  let layerSpec: ReturnType<typeof layerEntries>;
  let built: BuiltLayer;
  let layer: LazyLayer;
  let source: Awaited<ReturnType<typeof mountFromPeer>>['source'];
  let mnt: string;
  let mountedAfter: { sourceBytes: number; sourceRequests: number; registryBytes: number; reread: number };

  before(async () => {
    env = await startEnv();
    layerSpec = layerEntries(BIG_SIZE);
    built = await buildLayer(env.tmp.path, 'main', await makeTar(layerSpec), 1);
    await pushBlob(env, built.blobPath, built.result.digest, built.result.size);
    const mounted = await mountFromPeer(env, built.result.digest, built.result.tocDigest);
    ({ layer, source, mountpoint: mnt } = mounted);
    await sleep(300); // background fetch is off: nothing may arrive after mounting
    mountedAfter = {
      sourceBytes: source.counters.bytes,
      sourceRequests: source.counters.requests,
      registryBytes: registryBytes(env, built.result.digest),
      reread: await env.peer.metric('starling_peer_unverified_range_bytes_total'),
    };
  });

  after(async () => {
    await built?.close();
    await stopEnv(env);
  });

  test('mounting fetches the footer, the TOC and the prefetch region, nothing else', () => {
    const { size } = built.result;
    const tocOffset = built.reader.tocOffset;
    const landmark = built.reader.prefetchRange();
    assert.ok(landmark, 'the layer has a prefetch range');
    assert.ok(landmark.length > 300_000, 'the prioritized files come before the landmark');
    const prefetch = layer.stats().prefetch;
    // From the first prioritized chunk up to the landmark, in one request.
    const firstChunk = Math.min(...built.reader.chunks.filter((c) => c.end <= landmark.length).map((c) => c.offset));
    assert.equal(prefetch.length, landmark.length - firstChunk);
    assert.equal(prefetch.failed.length, 0);
    assert.ok(prefetch.chunks >= 3, `prefetched ${prefetch.chunks} chunks`);
    // Three requests: footer, TOC, prefetch; exactly their bytes.
    assert.equal(mountedAfter.sourceRequests, 3);
    assert.equal(mountedAfter.sourceBytes, FOOTER_SIZE + (size - FOOTER_SIZE - tocOffset) + prefetch.length);
    // The registry sent at most the peer's pieces covering those ranges (4 MiB pieces).
    const pieces = pieceLayout(size);
    const needed = new Set<number>();
    for (const [start, end] of [
      [firstChunk, landmark.length - 1],
      [tocOffset, size - 1],
    ] as const) {
      const { first, last } = piecesCovering(pieces, start, end);
      for (let i = first; i <= last; i++) needed.add(i);
    }
    // Plus ranges read again because the piece stored for them was not verified yet (the TOC, after
    // the footer's read brought the last piece): a later request is never served unverified bytes.
    const bound = [...needed].reduce((sum, i) => sum + pieceBounds(pieces, i).length, 0) + mountedAfter.reread;
    console.log(
      `# mount: source ${mountedAfter.sourceBytes} B in ${mountedAfter.sourceRequests} requests; registry sent ${mountedAfter.registryBytes} B of a ${size} B blob (bound ${bound})`,
    );
    assert.ok(mountedAfter.registryBytes > 0, 'the peer read the origin');
    assert.ok(
      mountedAfter.registryBytes <= bound,
      `registry sent ${mountedAfter.registryBytes} B, more than the ${bound} B of covering pieces`,
    );
    assert.ok(bound < size / 2);
  });

  test('prioritized files are served from the cache without a request', async () => {
    const requests = source.counters.requests;
    const hits = layer.stats().cacheHits;
    const res = await sh(
      'sha256sum',
      PRIORITIZED.map((p) => path.join(mnt, p)),
    );
    assert.equal(res.code, 0, res.stderr);
    assert.equal(source.counters.requests, requests);
    assert.ok(layer.stats().cacheHits > hits);
  });

  test('stat agrees with the TOC for every entry', async () => {
    const entries = visibleEntries(built.reader);
    const res = await sh('stat', ['-c', '%n|%f|%u|%g|%s|%h|%t|%T|%Y', '--', ...entries.map((e) => path.join(mnt, e.name))]);
    assert.equal(res.code, 0, res.stderr);
    const lines = res.stdout.trim().split('\n');
    assert.equal(lines.length, entries.length);
    lines.forEach((line, i) => {
      const [name, modeHex, uid, gid, size, nlink, major, minor, mtime] = line.split('|');
      const entry = itemAt(entries, i);
      const data = resolveHardlink(built.reader, entry);
      const type = data.type as keyof typeof TYPE_BITS;
      assert.equal(name, path.join(mnt, entry.name));
      assert.equal(parseInt(modeHex ?? '', 16), TYPE_BITS[type] | (data.mode & 0o7777), `mode of ${entry.name}`);
      assert.equal(Number(uid), data.uid, `uid of ${entry.name}`);
      assert.equal(Number(gid), data.gid, `gid of ${entry.name}`);
      const expectSize = type === 'reg' ? data.size : type === 'symlink' ? Buffer.byteLength(data.linkName) : 0;
      assert.equal(Number(size), expectSize, `size of ${entry.name}`);
      assert.equal(Number(mtime), Math.floor(Date.parse(data.modtime) / 1000), `mtime of ${entry.name}`);
      if (type === 'char' || type === 'block') {
        assert.deepEqual([parseInt(major ?? '', 16), parseInt(minor ?? '', 16)], [data.devMajor, data.devMinor], `device of ${entry.name}`);
      }
      if (type !== 'dir') {
        const links = built.reader.entries.filter(
          (e) => e === data || (e.type === 'hardlink' && resolveHardlink(built.reader, e) === data),
        ).length;
        assert.equal(Number(nlink), links, `nlink of ${entry.name}`);
      }
    });
    // Directories missing from the tar exist, as the Go reader makes them.
    const implicit = await sh('stat', ['-c', '%f', path.join(mnt, 'implicit/sub')]);
    assert.equal(parseInt(implicit.stdout, 16), S_IFDIR | 0o755);
    assert.equal(makedev(8, 0), 0x800);
  });

  test('ls -la, readlink and getfattr agree with the TOC', async () => {
    // -n: numeric owners, whatever /etc/passwd says
    const ls = await sh('ls', ['-lan', path.join(mnt, 'data')]);
    assert.equal(ls.code, 0, ls.stderr);
    const rows = new Map(
      ls.stdout
        .trim()
        .split('\n')
        .slice(1)
        .map((row) => [itemAt(row.split(/\s+/).slice(8).join(' ').split(' -> '), 0), row]),
    );
    const children = built.reader.entries.filter((e) => path.dirname(e.name) === 'data').map((e) => path.basename(e.name));
    assert.deepEqual([...rows.keys()].sort(), ['.', '..', ...children].sort());
    assert.match(rows.get('fifo') ?? '', /^prw------- +1 +0 +0 +0 /);
    assert.match(rows.get('link') ?? '', /^lrwxrwxrwx .* link -> small\.txt$/);
    assert.match(rows.get('small.txt') ?? '', /^-rw-r----- +2 1000 +1001 +17 /);
    const dev = await sh('ls', ['-lan', path.join(mnt, 'dev')]);
    assert.match(dev.stdout, /crw-rw-rw- +1 0 +0 +1, +3 .* null/);
    assert.match(dev.stdout, /brw-rw---- +1 0 +6 +8, +0 .* sda/);
    assert.match((await sh('ls', ['-ldn', path.join(mnt, 'odd')])).stdout, /^drwxrwxrwt /);
    assert.match((await sh('ls', ['-ln', path.join(mnt, 'odd')])).stdout, /-rwx--s--x +1 65534 +65533 .* setgid tool/);
    assert.match((await sh('ls', ['-ln', path.join(mnt, 'bin/tool')])).stdout, /^-rwsr-xr-x /);

    const symlinks = built.reader.entries.filter((e) => e.type === 'symlink');
    const readlink = await sh(
      'readlink',
      symlinks.map((e) => path.join(mnt, e.name)),
    );
    assert.deepEqual(
      readlink.stdout.trim().split('\n'),
      symlinks.map((e) => e.linkName),
    );

    const withXattrs = built.reader.entries.filter((e) => Object.keys(e.xattrs).length > 0);
    assert.equal(withXattrs.length, 2);
    for (const entry of withXattrs) {
      const res = await sh('getfattr', ['-d', '-m', '-', '--absolute-names', path.join(mnt, entry.name)]);
      assert.equal(res.code, 0, res.stderr);
      const got = Object.fromEntries(
        res.stdout
          .split('\n')
          .filter((l) => l.includes('='))
          .map((l) => [l.slice(0, l.indexOf('=')), JSON.parse(l.slice(l.indexOf('=') + 1)) as string]),
      );
      const want = Object.fromEntries(Object.entries(entry.xattrs).map(([k, v]) => [k, v.toString()]));
      assert.deepEqual(got, want, `xattrs of ${entry.name}`);
    }
    const none = await sh('getfattr', ['-d', '-m', '-', path.join(mnt, 'data/small.txt')]);
    assert.equal(none.stdout.trim(), '');
  });

  test('whiteouts are overlayfs whiteouts, opaque dirs carry trusted.overlay.opaque, landmarks are hidden', async () => {
    const root = await sh('ls', ['-a', mnt]);
    assert.doesNotMatch(root.stdout, /landmark/);
    const del = await sh('ls', ['-lan', path.join(mnt, 'del')]);
    assert.doesNotMatch(del.stdout, /\.wh\./);
    assert.match(del.stdout, /^c--------- +1 0 +0 +0, +0 .* removed$/m);
    assert.match(del.stdout, / still$/m);
    assert.deepEqual((await sh('ls', ['-A', path.join(mnt, 'gone')])).stdout, 'kept\n');
    const opaque = await sh('getfattr', ['--only-values', '-n', 'trusted.overlay.opaque', path.join(mnt, 'gone')]);
    assert.equal(opaque.code, 0, opaque.stderr);
    assert.equal(opaque.stdout, 'y');
    const notOpaque = await sh('getfattr', ['-n', 'trusted.overlay.opaque', path.join(mnt, 'data')]);
    assert.notEqual(notOpaque.code, 0);
  });

  test('overlayfs stacked on the mount honours its whiteouts and opaque directories', async () => {
    // A lower layer below ours holding what our layer deletes (as containerd's overlay stacks them).
    const lower = path.join(env.tmp.path, 'overlay-lower');
    const merged = path.join(env.tmp.path, 'overlay-merged');
    for (const dir of ['gone', 'del', 'data']) fs.mkdirSync(path.join(lower, dir), { recursive: true });
    fs.writeFileSync(path.join(lower, 'del/removed'), 'deleted by the upper layer');
    fs.writeFileSync(path.join(lower, 'del/other'), 'merged in');
    fs.writeFileSync(path.join(lower, 'gone/old'), 'hidden by the opaque directory');
    fs.writeFileSync(path.join(lower, 'data/extra'), 'merged in');
    fs.mkdirSync(merged);
    const mount = await sh('mount', ['-t', 'overlay', 'overlay', '-o', `ro,lowerdir=${mnt}:${lower}`, merged]);
    assert.equal(mount.code, 0, mount.stderr);
    try {
      assert.deepEqual((await sh('ls', ['-A', path.join(merged, 'gone')])).stdout.trim().split('\n'), ['kept']);
      assert.deepEqual((await sh('ls', ['-A', path.join(merged, 'del')])).stdout.trim().split('\n'), ['other', 'still']);
      assert.notEqual((await sh('stat', [path.join(merged, 'del/removed')])).code, 0);
      const data = (await sh('ls', ['-A', path.join(merged, 'data')])).stdout.trim().split('\n');
      assert.ok(data.includes('extra') && data.includes('small.txt'), data.join(' '));
      assert.equal((await sh('cat', [path.join(merged, 'del/still')])).stdout, 'not deleted\n');
    } finally {
      await sh('umount', [merged]);
    }
    assert.equal(isMounted(merged), false);
  });

  test('a read fetches only the chunks it needs', async () => {
    const small = itemAt(entryOf(built.reader, 'data/small.txt').chunks, 0);
    const bytes = source.counters.bytes;
    const cat = await sh('cat', [path.join(mnt, 'data/small.txt')]);
    assert.equal(cat.stdout, 'hello lazy layer\n');
    assert.equal(source.counters.bytes - bytes, small.end - small.offset);

    // 4 KiB from the middle of a 6-chunk file: its chunk, maybe the next two (chunk read-ahead),
    // never the ones before it nor the rest of the file.
    const multi = entryOf(built.reader, 'data/multi.bin').chunks;
    const dd = await sh('dd', [
      `if=${path.join(mnt, 'data/multi.bin')}`,
      'of=/dev/null',
      'bs=4096',
      'count=1',
      `skip=${(itemAt(multi, 2).chunkOffset + 8192) / 4096}`,
    ]);
    assert.equal(dd.code, 0, dd.stderr);
    await sleep(200); // let read-ahead settle
    const cached = multi.map((c) => fs.existsSync(chunkPath(layer.cacheDir, c.digest)));
    assert.deepEqual([cached[0], cached[1], cached[2], cached[5]], [false, false, true, false], `cached chunks: ${cached.join(', ')}`);
  });

  test('every file reads back with its original sha256 (sha256sum through the mount)', async () => {
    const files = visibleEntries(built.reader).filter((e) => e.type === 'reg' || e.type === 'hardlink');
    const t0 = performance.now();
    const res = await sh(
      'sha256sum',
      files.map((e) => path.join(mnt, e.name)),
    );
    const seconds = (performance.now() - t0) / 1000;
    assert.equal(res.code, 0, res.stderr);
    const sums = new Map(
      res.stdout
        .trim()
        .split('\n')
        .map((l) => [l.slice(66), l.slice(0, 64)]),
    );
    const original = new Map(
      layerSpec.flatMap((e) => (e.content ? [[e.name, createHash('sha256').update(e.content).digest('hex')] as const] : [])),
    );
    for (const entry of files) {
      const data = resolveHardlink(built.reader, entry);
      assert.equal(sums.get(path.join(mnt, entry.name)), data.digest.slice(7), `sha256 of ${entry.name}`);
      assert.equal(sums.get(path.join(mnt, entry.name)), original.get(data.name), `${entry.name} equals the tar's file`);
    }
    const total = files.reduce((n, e) => n + resolveHardlink(built.reader, e).size, 0);
    console.log(
      `# cold read of ${files.length} files, ${(total / 1e6).toFixed(1)} MB through peer+FUSE: ${(total / 1e6 / seconds).toFixed(0)} MB/s`,
    );

    // Warm: a second mount of the same layer on the same cache reads from disk only.
    const warm = await mountFromPeer(env, built.result.digest, built.result.tocDigest, { cacheDir: layer.cacheDir, prefetch: false });
    const requests = warm.source.counters.requests;
    const t1 = performance.now();
    const again = await sh('sha256sum', [path.join(warm.mountpoint, 'big/big.bin')]);
    const warmSeconds = (performance.now() - t1) / 1000;
    assert.equal(again.stdout.slice(0, 64), original.get('big/big.bin'));
    assert.equal(warm.source.counters.requests, requests, 'a warm cache needs no request');
    console.log(`# warm read of big.bin (${BIG_SIZE / 1e6} MB) from the chunk cache: ${(BIG_SIZE / 1e6 / warmSeconds).toFixed(0)} MB/s`);

    // Cached chunks are answered from their files by the FUSE addon. A chunk file cut short
    // behind the layer's back is noticed, fetched again, and the bytes are still right.
    const multi = entryOf(built.reader, 'data/multi.bin');
    const damaged = itemAt(multi.chunks, 3);
    await fs.promises.truncate(chunkPath(layer.cacheDir, damaged.digest), 100);
    const before = warm.source.counters.requests;
    const reread = await sh('sha256sum', [path.join(warm.mountpoint, 'data/multi.bin')]);
    assert.equal(reread.stdout.slice(0, 64), multi.digest.slice(7), 'a damaged cache file never yields wrong bytes');
    assert.ok(warm.source.counters.requests > before, 'the damaged chunk was fetched again');
    assert.equal(fs.statSync(chunkPath(layer.cacheDir, damaged.digest)).size, damaged.chunkSize);
    await unmount(env, warm.layer);
  });

  test('unmount leaves no mount behind', async () => {
    await unmount(env, layer);
    assert.equal(isMounted(mnt), false);
    assert.equal(layer.alive, false);
    assert.equal((await layer.closed).requested, true);
  });
});

function chunkPath(cacheDir: string, digest: string): string {
  const hex = digest.slice('sha256:'.length);
  return path.join(cacheDir, 'sha256', hex.slice(0, 2), hex);
}
