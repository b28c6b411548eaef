// Layers resolved ahead (src/snapshotter/layers-ahead.ts): when containerd prepares an image's first
// layer, its labels name the later ones; their footers, TOCs and prefetch ranges are fetched through
// the peer at once. A later mount then needs nothing more from the registry, and a TOC fetched ahead
// is used only if it is the one the mount's own labels vouch for. Real registry, real peer.
import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { silentLogger } from '../../src/common/log.js';
import { RemoteLayers } from '../../src/snapshotter/remote-layers.js';
import { pieceBounds, pieceLayout, piecesCovering } from '../../src/storage/piece-plan.js';
import { run, waitFor } from '../fixtures/processes.js';
import { blobBytesSent } from '../fixtures/registry.js';
import { pushBlob, REPO, startEnv, stopEnv, type Env } from '../lazy/helpers.js';
import { buildLayer, layerEntries, type BuiltLayer } from '../lazy/layer-fixture.js';
import { makeTar } from '../fixtures/tar.js';

describe('layers resolved ahead of their mount', () => {
  let env: Env;
  let layers: RemoteLayers;
  let built: BuiltLayer[];
  let mounts = 0;

  before(async () => {
    env = await startEnv();
    // gzip level 0 and 6 MiB of files: the prefetch range and the TOC are in different 4 MiB pieces.
    built = [
      await buildLayer(env.tmp.path, 'one', await makeTar(layerEntries(6 * 1024 * 1024 + 100)), 0),
      await buildLayer(env.tmp.path, 'two', await makeTar(layerEntries(6 * 1024 * 1024 + 200)), 0),
    ];
    for (const layer of built) await pushBlob(env, layer.blobPath, layer.result.digest, layer.result.size);
    layers = new RemoteLayers(
      {
        peer: env.peer.url,
        prefetch: { enabled: true, size: 0, warmFirstPiece: false, resolveAhead: true },
        backgroundFetch: { enabled: false, concurrency: 2, idleMs: 100 },
        fuse: { attrTimeout: 60, entryTimeout: 60 },
      },
      silentLogger,
    );
  });

  after(async () => {
    await layers?.closeAll();
    for (const layer of built ?? []) await layer.close();
    await stopEnv(env);
  });

  const source = (layer: BuiltLayer, tocDigest = layer.result.tocDigest) => ({
    registry: env.registry.host,
    repository: REPO,
    digest: layer.result.digest,
    tocDigest,
  });
  const mount = (layer: BuiltLayer, tocDigest?: string) => {
    const n = ++mounts;
    const mountpoint = path.join(env.tmp.path, `ahead-${n}`);
    return layers
      .ensure(`ahead-${n}`, mountpoint, path.join(env.tmp.path, `ahead-cache-${n}`), source(layer, tocDigest))
      .then(() => mountpoint);
  };
  const blob = (layer: BuiltLayer) => ({ registry: env.registry.host, repository: REPO, digest: layer.result.digest });

  test('a layer resolved ahead mounts without asking the registry for anything more', async () => {
    const [layer] = built as [BuiltLayer, BuiltLayer];
    await layers.resolveAhead([blob(layer)]);
    // The peer's pieces holding the prefetch range, the TOC and the footer (the registry logs each a moment after its last byte).
    const pieces = pieceLayout(layer.result.size);
    const wanted = new Set<number>();
    const prefetch = layer.reader.prefetchRange();
    assert.ok(prefetch, 'the layer has a prefetch range');
    for (const [start, end] of [
      [0, prefetch.length - 1],
      [layer.reader.tocOffset, layer.result.size - 1],
    ] as const) {
      const { first, last } = piecesCovering(pieces, start, end);
      for (let i = first; i <= last; i++) wanted.add(i);
    }
    const wantedBytes = [...wanted].reduce((n, i) => n + pieceBounds(pieces, i).length, 0);
    await waitFor(
      () => blobBytesSent(env.registry.requests(), layer.result.digest) >= wantedBytes,
      10_000,
      "the registry's log of the pieces read ahead",
    );
    const sent = () => blobBytesSent(env.registry.requests(), layer.result.digest);
    // A peer outside a swarm reads a range again from the registry when the pieces it stored for it
    // are not verified yet (a later request never gets unverified bytes): that, and nothing else.
    const reread = () => env.peer.metric('starling_peer_unverified_range_bytes_total');
    const [sentBefore, rereadBefore] = [sent(), await reread()];
    const mountpoint = await mount(layer);
    // Read by another process: this one serves the mount.
    const read = await run('cat', [path.join(mountpoint, 'etc/prio.conf')]);
    assert.equal(read.stdout, (await layer.reader.readFile('etc/prio.conf')).toString('utf8'));
    const rereadBytes = (await reread()) - rereadBefore;
    await waitFor(() => sent() >= sentBefore + rereadBytes, 10_000, "the registry's log of the ranges read again");
    assert.equal(sent() - sentBefore, rereadBytes, 'the mount found every piece at the peer');
  });

  test('a TOC resolved ahead that is not the one the labels name is not used: the mount fails on the digest', async () => {
    const [, layer] = built as [BuiltLayer, BuiltLayer];
    await layers.resolveAhead([blob(layer)]);
    const wrong = `sha256:${'0'.repeat(64)}`;
    await assert.rejects(mount(layer, wrong), /TOC digest mismatch/);
    // The right digest mounts it.
    const mountpoint = await mount(layer);
    assert.match((await run('ls', [mountpoint])).stdout, /etc/);
  });
});
