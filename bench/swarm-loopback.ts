// The swarm's two shapes on loopback, where nothing caps the links and the peers' own work per
// byte (receive, hash, store, relay) sets the pace: a seed and N peers pull one blob at once,
// through a mesh and through a pipeline, alternating round by round on the same machine.
//
//   npx tsc -p . && npx tsx bench/swarm-loopback.ts [--peers 8] [--size 512MB] [--rounds 2] [--json-out FILE]
//
// Prints each round's last-node time per shape and the ratio pipeline / mesh (below 1: the
// pipeline is faster). Every process runs on this machine's two cores, so this measures CPU cost,
// not the network; bench/swarm-cluster.ts measures shapes against link caps.

import fsp from 'node:fs/promises';
import { parseArgs } from 'node:util';
import { pushRandomBlob } from '../test/fixtures/images.js';
import { pullThrough, startPeer, startScheduler } from '../test/fixtures/peer.js';
import { startRegistry, type Registry } from '../test/fixtures/registry.js';
import { parseSize } from '../src/common/units.js';
import { fixed, median, table } from './lib/stats.js';
import { itemAt } from '../src/common/indexing.js';

const SHAPES = ['mesh', 'pipeline'] as const;
type Shape = (typeof SHAPES)[number];

const { values } = parseArgs({
  options: {
    peers: { type: 'string', default: '8' },
    size: { type: 'string', default: '512MB' },
    rounds: { type: 'string', default: '2' },
    'json-out': { type: 'string' },
  },
  strict: true,
});
const peerCount = Number(values.peers);
const rounds = Number(values.rounds);
if (!Number.isInteger(peerCount) || peerCount < 1 || peerCount > 60) throw new Error(`--peers must be 1…60, got ${values.peers}`);
if (!Number.isInteger(rounds) || rounds < 1) throw new Error(`--rounds must be a positive integer, got ${values.rounds}`);
const size = parseSize(values.size);

/** One pull: a fresh scheduler, seed and peers, all asking for the blob at once; seconds until each is done. */
async function pull(registry: Registry, shape: Shape, round: number): Promise<number[]> {
  const running: Array<{ stop(): Promise<void> }> = [];
  // A fresh block of loopback addresses per pull, so no two pulls share a host id.
  let host = 10 + (round * SHAPES.length + SHAPES.indexOf(shape)) * (peerCount + 2);
  const ip = () => `127.0.${Math.floor(host / 250) + 40}.${(host++ % 250) + 2}`;
  try {
    const scheduler = await startScheduler({ ip: ip(), extraArgs: ['--shape', shape, '--log-level', 'warn'] });
    running.push(scheduler);
    running.push(await startPeer({ ip: ip(), schedulers: [scheduler.address], seed: true, insecure: [registry.host] }));
    const peers = await Promise.all(
      Array.from({ length: peerCount }, () => startPeer({ ip: ip(), schedulers: [scheduler.address], insecure: [registry.host] })),
    );
    running.push(...peers);
    const repo = `bench/loopback-${shape}-${round}`;
    const blob = await pushRandomBlob(registry, repo, size);
    const start = performance.now();
    return await Promise.all(
      peers.map(async (peer) => {
        const pulled = await pullThrough(peer, registry, repo, blob.digest);
        if (pulled.digest !== blob.digest) throw new Error(`${shape}: a peer served the wrong bytes (HTTP ${pulled.status})`);
        return (performance.now() - start) / 1000;
      }),
    );
  } finally {
    for (const process of running.reverse()) await process.stop().catch(() => undefined);
  }
}

const registry = await startRegistry();
const rows: Array<Record<Shape, number[]>> = [];
try {
  for (let round = 0; round < rounds; round++) {
    const order = round % 2 === 0 ? SHAPES : [...SHAPES].reverse();
    const row = {} as Record<Shape, number[]>;
    for (const shape of order) row[shape] = await pull(registry, shape, round);
    rows.push(row);
    console.error(`round ${round + 1}: mesh last ${fixed(Math.max(...row.mesh))} s, pipeline last ${fixed(Math.max(...row.pipeline))} s`);
  }
} finally {
  await registry.stop();
}

const last = (times: number[]) => Math.max(...times);
const ratios = rows.map((row) => last(row.pipeline) / last(row.mesh));
console.log(`${peerCount} peers and a seed pull ${values.size} at once on loopback (${rounds} rounds, shapes alternating)`);
console.log(
  table(
    ['round', 'mesh: first / last s', 'pipeline: first / last s', 'pipeline / mesh (last)'],
    rows.map((row, i) => [
      String(i + 1),
      `${fixed(Math.min(...row.mesh))} / ${fixed(last(row.mesh))}`,
      `${fixed(Math.min(...row.pipeline))} / ${fixed(last(row.pipeline))}`,
      fixed(itemAt(ratios, i)),
    ]),
  ),
);
console.log(`median pipeline / mesh: ${fixed(median(ratios))}`);
if (values['json-out']) {
  await fsp.writeFile(
    values['json-out'],
    `${JSON.stringify({ kind: 'swarm-loopback', peers: peerCount, sizeBytes: size, rounds: rows, ratios }, null, 1)}\n`,
  );
}
