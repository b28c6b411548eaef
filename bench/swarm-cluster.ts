// Scenario (b): the Starling swarm, full download, on an emulated cluster.
//
//   npx tsx bench/swarm-cluster.ts --nodes 32 [--size 64MiB] [--node-rate 20mbit] [--origin-rate 80mbit] [--shape mesh|pipeline]
//   npx tsx bench/swarm-cluster.ts --nodes 32 --size 64MiB --node-rate 10mbit*24,3mbit*8 --origin-rate 40mbit [--rate-change n5=0.1x@20s]
//
// The same emulated cluster as bench/direct-pull.ts and bench/bittorrent-baseline.ts: a real
// docker-registry behind the origin's capped NIC, a Starling seed peer with the origin's rate
// (the role the BitTorrent seeder plays in the baseline), a scheduler on an uncapped host,
// and N nodes, each running a Starling peer in its own namespace behind its capped NIC. All
// nodes ask their local mirror for the blob at once (curl, piped through sha256sum). Reports
// per-node completion, the registry's egress in copies, T* (with the seed as the source) and
// last/T*, each node against its own bound (median and worst, per group of equal links), and
// the CPU use of the machine.

import { copyFile, mkdir, readdir } from 'node:fs/promises';
import path from 'node:path';
import { writeRandomFile } from '../test/fixtures/images.js';
import { makeTempDir, type Service } from '../test/fixtures/processes.js';
import { blobBytesSent } from '../test/fixtures/registry.js';
import {
  capOf,
  clusterLowerBound,
  createCluster,
  nowSeconds,
  seedOf,
  startCpuSampler,
  tcpPayloadBytes,
  type Cluster,
} from './lib/cluster.js';
import { startEgressSampler } from './lib/egress.js';
import { startNsRegistry, type NsRegistry } from './lib/ns-registry.js';
import { MIRROR, startSwarm, sumPeerMetric } from './lib/swarm.js';
import {
  againstOwnBounds,
  boundLine,
  cpuLine,
  armWholePulls,
  startSpread,
  reportJson,
  scenarioArgs,
  startRateChanges,
  startRates,
  summarize,
  warnIfOverBudget,
  type NodeTiming,
} from './lib/scenario.js';
import { fixed, table } from './lib/stats.js';

const a = scenarioArgs('swarm-cluster', {
  'parent-limit': { type: 'string', default: '5', help: 'candidate parents per peer (scheduler)' },
  shape: { type: 'string', default: 'adaptive', help: "the scheduler's parent graph: adaptive (its default), mesh or pipeline" },
  'scheduler-args': { type: 'string', default: '', help: 'extra flags for the scheduler, e.g. "--seed-fanout 4"' },
  'peer-args': { type: 'string', default: '', help: 'extra flags for every node\'s peer, e.g. "--piece-parallelism 16"' },
  'seed-args': { type: 'string', default: '', help: 'extra flags for the seed peer' },
  'keep-logs': { type: 'string', default: '', help: 'copy every process log into this folder before cleaning up' },
});
warnIfOverBudget(a);
const F = a.sizeBytes;
const N = a.nodes;
const REPO = 'bench/blob';

const work = await makeTempDir('starling-bench-swarm-');
let cluster: Cluster | undefined;
let registry: NsRegistry | undefined;
const services: Service[] = [];
try {
  const blobFile = path.join(work.path, 'blob');
  const { sha256 } = await writeRandomFile(blobFile, F, `swarm-${F}`);
  const digest = `sha256:${sha256}`;

  cluster = await createCluster({
    nodes: N,
    nodeRate: startRates(a.links),
    originRate: a.originRate,
    seed: { rate: a.originRate },
    extras: [{ name: 'sched' }],
  });
  const c = cluster;
  registry = await startNsRegistry(c, c.origin);
  await registry.pushBlobFile(REPO, blobFile, digest);
  const registryHost = `${c.origin.ip}:${registry.port}`;
  const swarm = await startSwarm(c, {
    registryHost,
    workDir: work.path,
    parentLimit: String(a.extra['parent-limit']),
    schedulerArgs: [
      '--shape',
      String(a.extra.shape),
      ...String(a.extra['scheduler-args'] ?? '')
        .split(' ')
        .filter(Boolean),
    ],
    peerArgs: String(a.extra['peer-args'] ?? '')
      .split(' ')
      .filter(Boolean),
    seedArgs: String(a.extra['seed-args'] ?? '')
      .split(' ')
      .filter(Boolean),
  });
  services.push(...swarm.services);

  // T* with the links as they start (changes during the run count in each node's own bound).
  const lb = clusterLowerBound(F, seedOf(c), c.nodes);
  const before = await c.counters(c.origin);
  const url = `http://${MIRROR}/v2/${REPO}/blobs/${digest}?ns=${registryHost}`;
  const pulls = await armWholePulls(c, c.nodes, url, F, sha256);
  const egress = await startEgressSampler(c, c.origin);
  const cpu = startCpuSampler(500, () => c.cpuSeconds());
  const t0 = nowSeconds();
  const changes = startRateChanges(c, a.links, t0, nowSeconds);
  const pulled = await pulls.release();
  const timings = pulled.map(({ node, endedAt }) => ({ node: node.name, done: endedAt - t0 }) satisfies NodeTiming);
  const cpuReport = cpu.stop();
  const rateChanges = await changes.stop();
  const egressRecord = await egress.stop();
  const after = await c.counters(c.origin);
  // Where the nodes' bytes came from, as the scheduler saw it.
  const stat = await swarm.task(digest);
  if (process.env.STARLING_BENCH_VERBOSE) {
    for (const peer of stat.peers ?? []) {
      const from = Object.entries(peer.bytesByParentHost).map(([host, bytes]) => `${host}:${(bytes / 2 ** 20).toFixed(0)}M`);
      console.log(`  ${peer.hostId} got ${from.join(' ')}`);
    }
  }
  // How the upload servers answered (every peer's own counters, summed).
  const uploadRequests = await sumPeerMetric(c, /^starling_peer_upload_requests_total\{kind="(\w+)",outcome="(\w+)"\} (\d+)/gm);
  const egressPayload = tcpPayloadBytes(after.txBytes - before.txBytes, after.txPackets - before.txPackets);
  const logged = blobBytesSent(registry.requests(), digest);
  const s = summarize(timings);
  const own = againstOwnBounds(timings, a.links, F, capOf(seedOf(c), 'up'));
  const result = {
    kind: 'starling-swarm',
    shape: String(a.extra.shape),
    schedulerArgs: String(a.extra['scheduler-args'] ?? ''),
    peerArgs: String(a.extra['peer-args'] ?? ''),
    seedArgs: String(a.extra['seed-args'] ?? ''),
    nodes: N,
    sizeBytes: F,
    nodeRate: a.nodeRate,
    rateChanges: a.rateChanges,
    rateChangesInPlace: rateChanges,
    originRate: a.originRate,
    lowerBound: lb,
    firstSeconds: s.first,
    medianSeconds: s.median,
    lastSeconds: s.last,
    ratio: s.last / lb.seconds,
    originEgressCopies: egressPayload / F,
    registryLoggedCopies: logged / F,
    nodeBytesFromSeedCopies: (stat.bytesFromSeeds ?? 0) / F,
    nodeBytesFromPeersCopies: (stat.bytesFromPeers ?? 0) / F,
    cpu: cpuReport,
    uploadRequests,
    egress: egressRecord,
    ownBound: own.ownBound,
    perNode: own.perNode,
    startSpreadSeconds: startSpread(pulled),
  };
  console.log(
    `starling swarm (${result.shape}): ${N} nodes × ${a.sizeText} (${F} B); nodes ${a.nodeRate}, seed and origin ${a.originRate}`,
  );
  console.log(boundLine(lb));
  console.log(
    table(
      ['scenario', 'N', 'size', 'node', 'seed/origin', 'T* s', 'first s', 'median s', 'last s', 'last/T*', 'registry egress (copies)'],
      [
        [
          'starling swarm',
          String(N),
          a.sizeText,
          a.nodeRate,
          a.originRate,
          fixed(lb.seconds),
          fixed(s.first),
          fixed(s.median),
          fixed(s.last),
          fixed(result.ratio),
          `${fixed(result.originEgressCopies)} (log ${fixed(result.registryLoggedCopies)})`,
        ],
      ],
    ),
  );
  for (const line of own.lines) console.log(line);
  console.log(`every node's pull began within ${fixed(result.startSpreadSeconds, 3)} s of the start gate`);
  for (const change of rateChanges) console.log(`${change.node}'s link changed at ${fixed(change.inPlace)} s (asked for ${change.at} s)`);
  console.log(
    `per node (s): ${[...timings]
      .sort((x, y) => x.done - y.done)
      .map((t) => `${t.node}=${fixed(t.done, 1)}`)
      .join(' ')}`,
  );
  console.log(
    `nodes got ${fixed(result.nodeBytesFromSeedCopies)} copies from the seed and ${fixed(result.nodeBytesFromPeersCopies)} from other nodes`,
  );
  console.log(
    `upload requests: ${Object.entries(uploadRequests)
      .sort()
      .map(([k, v]) => `${k} ${v}`)
      .join(', ')}`,
  );
  console.log(cpuLine(cpuReport));
  await reportJson(a, result);
} finally {
  for (const service of services.reverse()) await service.stop().catch(() => {});
  await registry?.stop().catch(() => {});
  await cluster?.destroy();
  const keep = String(a.extra['keep-logs'] ?? '');
  if (keep) {
    await mkdir(keep, { recursive: true });
    for (const name of await readdir(work.path))
      if (name.endsWith('.log')) await copyFile(path.join(work.path, name), path.join(keep, name));
  }
  await work.remove();
}
