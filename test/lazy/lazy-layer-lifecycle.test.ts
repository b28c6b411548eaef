// The lazy layer's failure and lifecycle cases against a real registry and peer: a corrupt chunk,
// background fetch, unmounting while busy, and a mount whose server was killed.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { detachMount, fuseMountHealth } from '../../src/fuse/index.js';
import { mirrorBlobUrl } from '../../src/lazy/index.js';
import { pieceBounds, pieceLayout, piecesCovering } from '../../src/storage/piece-plan.js';
import { spawnService, waitFor } from '../fixtures/processes.js';
import { buildLayer, corruptChunkCopy, layerEntries, type BuiltLayer } from './layer-fixture.js';
import { makeTar } from '../fixtures/tar.js';
import {
  isMounted,
  mountFromPeer,
  pushBlob,
  registryBytes,
  REPO,
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

const SERVE_LAYER = path.join(path.dirname(fileURLToPath(import.meta.url)), 'serve-layer.ts');

describe('lazy layer lifecycle and failures', () => {
  let env: Env;
  let built: BuiltLayer;
  let stored: BuiltLayer; // gzip level 0: file bytes stored verbatim, for chunk surgery

  before(async () => {
    env = await startEnv();
    const tar = await makeTar(layerEntries(6 * 1024 * 1024));
    built = await buildLayer(env.tmp.path, 'main', tar, 1);
    stored = await buildLayer(env.tmp.path, 'stored', tar, 0);
    await pushBlob(env, built.blobPath, built.result.digest, built.result.size);
  });

  after(async () => {
    await built?.close();
    await stored?.close();
    await stopEnv(env);
  });

  test('a chunk whose bytes do not match its chunkDigest gives EIO for that file only', async () => {
    const corruptPath = path.join(env.tmp.path, 'corrupt.estargz');
    const corrupt = await corruptChunkCopy(stored, 'x/attrs', corruptPath);
    await pushBlob(env, corruptPath, corrupt.digest, corrupt.size);
    // The TOC is untouched: the layer opens with the original TOC digest.
    const { layer, mountpoint, warnings } = await mountFromPeer(env, corrupt.digest, stored.result.tocDigest);
    try {
      for (let attempt = 0; attempt < 2; attempt++) {
        const bad = await sh('cat', [path.join(mountpoint, 'x/attrs')]);
        assert.notEqual(bad.code, 0, 'reading the corrupt file must fail');
        assert.match(bad.stderr, /Input\/output error/);
        assert.equal(bad.stdout, '', 'no byte of the corrupt chunk is served');
      }
      // Each read checked the chunk again (the kernel may retry a failed read): nothing was cached.
      assert.ok(layer.stats().digestMismatches >= 2, `mismatches: ${layer.stats().digestMismatches}`);
      const badChunk = itemAt(entryOf(stored.reader, 'x/attrs').chunks, 0).digest.slice(7);
      assert.equal(fs.existsSync(path.join(layer.cacheDir, 'sha256', badChunk.slice(0, 2), badChunk)), false);
      assert.ok(
        warnings.some((w) => /does not match the TOC/.test(w)),
        warnings.join('\n'),
      );
      const others = visibleEntries(stored.reader).filter((e) => (e.type === 'reg' || e.type === 'hardlink') && e.name !== 'x/attrs');
      const sums = await sh(
        'sha256sum',
        others.map((e) => path.join(mountpoint, e.name)),
      );
      assert.equal(sums.code, 0, sums.stderr);
      const got = sums.stdout
        .trim()
        .split('\n')
        .map((l) => l.slice(0, 64));
      assert.deepEqual(
        got,
        others.map((e) => resolveHardlink(stored.reader, e).digest.slice(7)),
      );
    } finally {
      await unmount(env, layer);
    }
  });

  test('background fetch fills the cache; afterwards reads need no request', async () => {
    const { layer, source, mountpoint } = await mountFromPeer(env, built.result.digest, built.result.tocDigest, {
      prefetch: false,
      backgroundFetch: { enabled: true, concurrency: 2, idleMs: 20 },
    });
    try {
      assert.ok(layer.backgroundDone, 'background fetch runs');
      await layer.backgroundDone;
      const progress = layer.stats().background;
      assert.ok(progress, 'background fetch reports progress');
      assert.equal(progress.failed, 0);
      assert.equal(progress.done, progress.total);
      const digests = new Set(built.reader.chunks.map((c) => c.digest));
      for (const digest of digests) {
        const hex = digest.slice(7);
        assert.ok(fs.existsSync(path.join(layer.cacheDir, 'sha256', hex.slice(0, 2), hex)), `chunk ${digest} cached`);
      }
      assert.equal(layer.stats().chunksFetched, digests.size);
      const requests = source.counters.requests;
      const files = visibleEntries(built.reader).filter((e) => e.type === 'reg');
      const sums = await sh(
        'sha256sum',
        files.map((e) => path.join(mountpoint, e.name)),
      );
      assert.equal(sums.code, 0, sums.stderr);
      assert.deepEqual(
        sums.stdout
          .trim()
          .split('\n')
          .map((l) => l.slice(0, 64)),
        files.map((e) => e.digest.slice(7)),
      );
      assert.equal(source.counters.requests, requests, 'everything came from the cache');
    } finally {
      await unmount(env, layer);
    }
  });

  test('with background fetch off, nothing is fetched after the mount', async () => {
    const { layer, source } = await mountFromPeer(env, built.result.digest, built.result.tocDigest, { prefetch: false });
    try {
      const requests = source.counters.requests;
      await new Promise((resolve) => setTimeout(resolve, 400));
      assert.equal(source.counters.requests, requests);
      assert.equal(layer.backgroundDone, undefined);
    } finally {
      await unmount(env, layer);
    }
  });

  test('warmFirstPiece makes the peer fetch the first piece while the footer and the TOC are read', async () => {
    // Two fresh layers (gzip level 0: the TOC lands beyond the first 4 MiB piece).
    const cold = await buildLayer(env.tmp.path, 'cold', await makeTar(layerEntries(6 * 1024 * 1024 + 1000)), 0);
    const warm = await buildLayer(env.tmp.path, 'warm', await makeTar(layerEntries(6 * 1024 * 1024 + 2000)), 0);
    /** Bytes of the peer's pieces covering [tocOffset, size): what reading the footer and the TOC costs the origin. */
    const tailPieces = (layer: BuiltLayer) => {
      const pieces = pieceLayout(layer.result.size);
      const { first, last } = piecesCovering(pieces, layer.reader.tocOffset, layer.result.size - 1);
      assert.ok(first > 0, 'the TOC must be outside the first piece');
      let bytes = 0;
      for (let i = first; i <= last; i++) bytes += pieceBounds(pieces, i).length;
      return bytes;
    };
    try {
      for (const layer of [cold, warm]) await pushBlob(env, layer.blobPath, layer.result.digest, layer.result.size);
      // Ranges read again because the piece stored for them was not verified yet (the TOC, after the
      // footer's read brought the last piece) come on top: a later request gets only verified bytes.
      const reread = () => env.peer.metric('starling_peer_unverified_range_bytes_total');
      const rereadBefore = await reread();
      const plain = await mountFromPeer(env, cold.result.digest, cold.result.tocDigest, { prefetch: false });
      assert.equal(plain.source.counters.requests, 2, 'footer and TOC only');
      await unmount(env, plain.layer);
      assert.equal(
        registryBytes(env, cold.result.digest),
        tailPieces(cold) + (await reread()) - rereadBefore,
        'the pieces holding the TOC and the footer only',
      );

      const warmBefore = await reread();
      const warmed = await mountFromPeer(env, warm.result.digest, warm.result.tocDigest, { prefetch: false, warmFirstPiece: true });
      // The first byte's answer comes once the peer has it from the origin, which may be after the
      // footer's and the TOC's: the mount does not wait for it, so neither does the count.
      await waitFor(() => warmed.source.counters.requests === 3, 10_000, 'the answer to the first-byte read');
      assert.equal(warmed.source.counters.requests, 3, 'footer, TOC and the first byte');
      await unmount(env, warmed.layer);
      const expected = tailPieces(warm) + pieceBounds(pieceLayout(warm.result.size), 0).length + (await reread()) - warmBefore;
      await waitFor(() => registryBytes(env, warm.result.digest) >= expected, 10_000, 'the first piece from the origin');
      assert.equal(registryBytes(env, warm.result.digest), expected, 'the first piece too, once');
    } finally {
      await cold.close();
      await warm.close();
    }
  });

  test("whiteouts: 'raw' shows the TOC's .wh. entries and landmarks as stored", async () => {
    const { layer, mountpoint } = await mountFromPeer(env, built.result.digest, built.result.tocDigest, {
      whiteouts: 'raw',
      prefetch: false,
    });
    try {
      assert.deepEqual((await sh('ls', ['-A', path.join(mountpoint, 'gone')])).stdout.trim().split('\n'), ['.wh..wh..opq', 'kept']);
      assert.deepEqual((await sh('ls', ['-A', path.join(mountpoint, 'del')])).stdout.trim().split('\n'), ['.wh.removed', 'still']);
      assert.match((await sh('ls', ['-A', mountpoint])).stdout, /^\.prefetch\.landmark$/m);
      assert.notEqual((await sh('getfattr', ['-n', 'trusted.overlay.opaque', path.join(mountpoint, 'gone')])).code, 0);
    } finally {
      await unmount(env, layer);
    }
  });

  test('unmount of a busy layer fails with EBUSY and keeps serving; a lazy unmount detaches it', async () => {
    const { layer, mountpoint } = await mountFromPeer(env, built.result.digest, built.result.tocDigest);
    const holder = await spawnService({
      cmd: 'sh',
      args: ['-c', `exec 3< "${mountpoint}/data/small.txt"; echo open; exec sleep 60`],
      name: 'holder',
    });
    try {
      await waitFor(() => holder.readLog().includes('open'), 5000, 'holder has the file open');
      await assert.rejects(layer.unmount(), (error: Error & { errno?: number }) => error.errno === 16); // EBUSY
      assert.ok(isMounted(mountpoint));
      assert.equal((await sh('cat', [path.join(mountpoint, 'data/small.txt')])).stdout, 'hello lazy layer\n');

      await layer.unmount({ lazy: true });
      assert.equal(isMounted(mountpoint), false, 'detached from the namespace at once');
      assert.equal(layer.alive, true, 'still serving the open file');
      await holder.stop();
      const exit = await layer.closed;
      assert.equal(exit.requested, true);
      assert.equal(layer.alive, false);
    } finally {
      await holder.stop();
      if (layer.alive) await layer.unmount({ lazy: true }).catch(() => {});
      env.mounts.delete(layer);
    }
  });

  test('a mount whose server was killed is detected as dead and can be cleared', async () => {
    const mountpoint = path.join(env.tmp.path, 'killed');
    fs.mkdirSync(mountpoint);
    const config = {
      url: mirrorBlobUrl(env.peer.url, REPO, built.result.digest, env.registry.host),
      tocDigest: built.result.tocDigest,
      mountpoint,
      cacheDir: path.join(env.tmp.path, 'killed-cache'),
    };
    const server = await spawnService({
      cmd: process.execPath,
      args: ['--import', 'tsx', SERVE_LAYER, JSON.stringify(config)],
      name: 'serve-layer',
    });
    try {
      await waitFor(() => server.readLog().includes('ready') || !server.running, 30_000, 'layer served by a child process');
      assert.ok(server.running, server.logTail());
      assert.equal(await fuseMountHealth(mountpoint), 'alive');
      await server.kill9();
      assert.equal(await fuseMountHealth(mountpoint), 'dead');
      const cat = await sh('cat', [path.join(mountpoint, 'etc/prio.conf')]);
      assert.match(cat.stderr, /Transport endpoint is not connected/);
      await detachMount(mountpoint);
      assert.equal(await fuseMountHealth(mountpoint), 'absent');
      assert.equal(isMounted(mountpoint), false);
    } finally {
      await server.kill9();
      if (isMounted(mountpoint)) await detachMount(mountpoint).catch(() => {});
    }
  });
});
