// Scenario (a): every node pulls the same blob straight from the origin registry.
//
//   npx tsx bench/direct-pull.ts --nodes 8 [--size 16MiB] [--node-rate 20mbit] [--origin-rate 80mbit]
//
// An emulated cluster (bench/lib/cluster.ts): a real docker-registry (distribution 2.8) in
// the origin's namespace behind the origin's capped NIC, N nodes in their own namespaces
// behind their capped NICs. The blob (random bytes) is pushed over the origin's loopback
// first; then all nodes GET /v2/<repo>/blobs/<digest> at once with curl, each piping the
// body through sha256sum. Reports per-node completion times, the origin's egress in copies
// of the blob (from its NIC's counters), the Kumar–Ross lower bound T* and last/T*.

import path from 'node:path';
import { writeRandomFile } from '../test/fixtures/images.js';
import { blobBytesSent } from '../test/fixtures/registry.js';
import { makeTempDir } from '../test/fixtures/processes.js';
import {
  capOf,
  clusterLowerBound,
  createCluster,
  nowSeconds,
  softnetDrops,
  startCpuSampler,
  tcpPayloadBytes,
  type Cluster,
} from './lib/cluster.js';
import { startEgressSampler } from './lib/egress.js';
import { startNsRegistry, type NsRegistry } from './lib/ns-registry.js';
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
import { itemAt } from '../src/common/indexing.js';

const a = scenarioArgs('direct-pull');
warnIfOverBudget(a);
const F = a.sizeBytes;
const N = a.nodes;
const REPO = 'bench/blob';

const work = await makeTempDir('starling-bench-direct-');
let cluster: Cluster | undefined;
let registry: NsRegistry | undefined;
try {
  const blobFile = path.join(work.path, 'blob');
  const { sha256 } = await writeRandomFile(blobFile, F, `direct-pull-${F}`);
  const digest = `sha256:${sha256}`;

  cluster = await createCluster({ nodes: N, nodeRate: startRates(a.links), originRate: a.originRate });
  registry = await startNsRegistry(cluster, cluster.origin);
  await registry.pushBlobFile(REPO, blobFile, digest);
  const url = `${registry.url}/v2/${REPO}/blobs/${digest}`;

  const c = cluster;
  // T* with the links as they start (changes during the run count in each node's own bound).
  const lb = clusterLowerBound(F, c.origin, c.nodes);
  const before = await c.counters(c.origin);
  const softnet0 = softnetDrops();
  const pulls = await armWholePulls(c, c.nodes, url, F, sha256);
  const egress = await startEgressSampler(c, c.origin);
  const cpu = startCpuSampler(500, () => c.cpuSeconds());
  const t0 = nowSeconds();
  const changes = startRateChanges(c, a.links, t0, nowSeconds);
  const pulled = await pulls.release();
  const timings = pulled.map(
    ({ node, endedAt, curlSeconds }) =>
      ({ node: node.name, done: endedAt - t0, curlSeconds }) satisfies NodeTiming & { curlSeconds: number },
  );
  const cpuReport = cpu.stop();
  const rateChanges = await changes.stop();
  const egressRecord = await egress.stop();
  const after = await c.counters(c.origin);

  const egressWire = after.txBytes - before.txBytes;
  const egressPayload = tcpPayloadBytes(egressWire, after.txPackets - before.txPackets);
  // What the registry says it wrote for GETs of this blob (its access log), as a cross-check.
  const logged = blobBytesSent(registry.requests(), digest);
  const s = summarize(timings);
  const own = againstOwnBounds(timings, a.links, F, capOf(c.origin, 'up'));
  const directBound = (N * F) / (capOf(c.origin, 'up') / 8); // the best any direct pull can do
  const result = {
    kind: 'direct-pull',
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
    directBoundSeconds: directBound,
    originEgressCopies: egressPayload / F,
    originEgressWireCopies: egressWire / F,
    registryLoggedCopies: logged / F,
    cpu: cpuReport,
    softnetDrops: softnetDrops() - softnet0,
    egress: egressRecord,
    ownBound: own.ownBound,
    perNode: own.perNode.map((p, i) => ({ ...p, curl: itemAt(timings, i).curlSeconds })),
    startSpreadSeconds: startSpread(pulled),
  };

  console.log(`direct pull: ${N} nodes × ${a.sizeText} (${F} B) from docker-registry; nodes ${a.nodeRate}, origin ${a.originRate}`);
  console.log(boundLine(lb));
  console.log(
    table(
      [
        'scenario',
        'N',
        'size',
        'node',
        'origin',
        'T* s',
        'first s',
        'median s',
        'last s',
        'last/T*',
        'N·F/u_s s',
        'origin egress (copies)',
      ],
      [
        [
          'direct pull',
          String(N),
          a.sizeText,
          a.nodeRate,
          a.originRate,
          fixed(lb.seconds),
          fixed(s.first),
          fixed(s.median),
          fixed(s.last),
          fixed(result.ratio),
          fixed(directBound),
          `${fixed(result.originEgressCopies)} (wire ${fixed(result.originEgressWireCopies)})`,
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
  console.log(cpuLine(cpuReport));
  await reportJson(a, result);
} finally {
  await registry?.stop().catch(() => {});
  await cluster?.destroy();
  await work.remove();
}
