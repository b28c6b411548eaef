// Cold pull through the mirror when the registry is across a network link, as it is in real
// deployments (the mirror runs on the node; the registry does not), against a direct pull over the
// same link, in the same run. bench/peer-mirror.ts measures the same on loopback, where the
// registry delivers ~2 GB/s and the comparison is between SHA-256 and memcpy rather than a mirror
// and a network.
//
//   npx tsc -p . && npx tsx bench/peer-mirror-link.ts [--size 1GB] [--rates 1gbit,2500mbit] [--rounds 3]
//        [--cpu-prof DIR]
//
// --cpu-prof DIR makes every peer write a V8 .cpuprofile into DIR when it stops (summarize one with
// `npx tsx bench/lib/cpuprofile.ts FILE`).
//
// For each rate: an emulated cluster (bench/lib/cluster.ts) of the registry's host, whose NIC is
// capped at the rate, and one node (uncapped: 40 Gbit/s) running `starling peer` and curl. Each
// round: a fresh peer (empty data dir); the direct GET and the mirror GET take turns going first.
// Ratio = direct time / mirror time (goal ≥ 0.9, issue 2).

import path from 'node:path';
import { parseArgs } from 'node:util';
import { writeRandomFile } from '../test/fixtures/images.js';
import { makeTempDir, waitFor } from '../test/fixtures/processes.js';
import { STARLING_CLI } from '../test/fixtures/peer.js';
import { formatBitRate, parseBitRate, parseSize } from '../src/common/units.js';
import { createCluster, type Cluster } from './lib/cluster.js';
import { startNsRegistry } from './lib/ns-registry.js';
import { fixed, mbps, median, table } from './lib/stats.js';
import { itemAt } from '../src/common/indexing.js';

const GOAL = 0.9;
const REPO = 'bench/link';
const NODE_RATE = '40gbit';
const { values: args } = parseArgs({
  options: {
    size: { type: 'string', default: '1GB' },
    rates: { type: 'string', default: '1gbit,2500mbit' },
    rounds: { type: 'string', default: '3' },
    'cpu-prof': { type: 'string' },
  },
});
const F = parseSize(args.size);
const RATES = args.rates.split(',').map((r) => r.trim());
const ROUNDS = Math.max(1, Number(args.rounds));
const CPU_PROF = args['cpu-prof'] ? ['--cpu-prof', '--cpu-prof-dir', path.resolve(args['cpu-prof'])] : [];
const log = (message: string) => console.log(`[${new Date().toISOString().slice(11, 19)}] ${message}`);

interface Get {
  seconds: number;
  bytes: number;
}

async function curl(cluster: Cluster, url: string): Promise<Get> {
  const res = await cluster.exec(
    itemAt(cluster.nodes, 0),
    'curl',
    ['-sS', '--fail', '-o', '/dev/null', '--noproxy', '*', '-w', '%{size_download} %{time_total}', url],
    { timeoutMs: 1_800_000 },
  );
  const [bytes, seconds] = res.stdout.trim().split(' ').map(Number) as [number, number];
  if (bytes !== F) throw new Error(`GET ${url}: ${bytes} bytes, expected ${F}`);
  return { seconds, bytes };
}

const work = await makeTempDir('starling-bench-link-');
const rows: string[][] = [];
const results: unknown[] = [];
try {
  const blobFile = path.join(work.path, 'blob');
  const { sha256 } = await writeRandomFile(blobFile, F, `link-${F}`);
  const digest = `sha256:${sha256}`;
  for (const rate of RATES) {
    const cluster = await createCluster({ nodes: 1, nodeRate: NODE_RATE, originRate: rate });
    try {
      const registry = await startNsRegistry(cluster, cluster.origin);
      await registry.pushBlobFile(REPO, blobFile, digest);
      const registryHost = new URL(registry.url).host;
      const direct = `${registry.url}/v2/${REPO}/blobs/${digest}`;
      const ratios: number[] = [];
      const speeds = { direct: [] as number[], mirror: [] as number[] };
      for (let round = 0; round < ROUNDS; round++) {
        const dataDir = path.join(work.path, `peer-${rate}-${round}`);
        const port = 65001;
        const peer = await cluster.spawn(
          itemAt(cluster.nodes, 0),
          process.execPath,
          [
            ...CPU_PROF,
            STARLING_CLI,
            'peer',
            '--data-dir',
            dataDir,
            '--mirror-listen',
            `127.0.0.1:${port}`,
            '--insecure-registry',
            registryHost,
            '--log-level',
            'warn',
          ],
          { name: 'starling-peer', logFile: path.join(work.path, `peer-${round}.log`) },
        );
        try {
          await waitFor(
            async () =>
              (
                await cluster.exec(
                  itemAt(cluster.nodes, 0),
                  'curl',
                  ['-s', '-o', '/dev/null', '-w', '%{http_code}', `http://127.0.0.1:${port}/healthz`],
                  { allowFail: true },
                )
              ).stdout === '200',
            10_000,
            'the peer to answer /healthz',
          );
          const mirror = `http://127.0.0.1:${port}/v2/${REPO}/blobs/${digest}?ns=${registryHost}`;
          let d: Get;
          let m: Get;
          if (round % 2 === 0) {
            d = await curl(cluster, direct);
            m = await curl(cluster, mirror);
          } else {
            m = await curl(cluster, mirror);
            d = await curl(cluster, direct);
          }
          ratios.push(d.seconds / m.seconds);
          speeds.direct.push(F / d.seconds);
          speeds.mirror.push(F / m.seconds);
          log(
            `${rate} round ${round + 1}: direct ${mbps(F / d.seconds)} MB/s, mirror ${mbps(F / m.seconds)} MB/s, ratio ${fixed(d.seconds / m.seconds)}`,
          );
        } finally {
          await peer.stop();
        }
      }
      const ratio = median(ratios);
      results.push({
        rate: parseBitRate(rate),
        directBytesPerSecond: median(speeds.direct),
        mirrorBytesPerSecond: median(speeds.mirror),
        ratio,
        ratios,
      });
      rows.push([
        `cold pull, registry link ${formatBitRate(parseBitRate(rate))}`,
        `${mbps(median(speeds.mirror))} MB/s`,
        `${mbps(median(speeds.direct))} MB/s`,
        fixed(ratio),
        `≥ ${GOAL}`,
        ratio >= GOAL ? 'pass' : 'FAIL',
      ]);
      await registry.stop();
    } finally {
      await cluster.destroy();
    }
  }
  console.log(`\nstarling peer mirror, cold pull over a capped registry link — ${mbps(F)} MB blob, median of ${ROUNDS} alternating rounds`);
  console.log(table(['measure', 'mirror', 'direct', 'ratio', 'goal', 'result'], rows));
  console.log(JSON.stringify({ bench: 'peer-mirror-link', size: F, rounds: ROUNDS, results }));
} finally {
  await work.remove();
}
