// Scenario (c) beside (b): N nodes start the same workload at once through the Starling swarm, from
// an eStargz image that `starling optimize` prepared for it, either
//   lazy — each node mounts the layer lazily through its own peer (footer, TOC, the prioritized
//          files in one Range request) and reads the files the workload read, in the recorded
//          order (bench/lib/lazy-reader.ts: the FUSE mount of the snapshotter, without containerd);
//   full — each node downloads the whole layer blob through its peer (scenario b).
//
//   npx tsx bench/swarm-lazy.ts [--nodes 8] [--node-rate 100mbit] [--origin-rate 400mbit] [--scenarios full,lazy] [--shape mesh|pipeline]
//                               [--plots DIR] [--json-out FILE] [--keep-logs DIR]
//
// The image is the Debian + python3 one of bench/lazy-start.ts (workload `python3 -c 'import json,
// sqlite3'`, 40 files recorded), cached in /var/tmp; its layer blob is pushed to a real
// docker-registry behind the origin's capped NIC. Each scenario gets a fresh swarm (scheduler, seed
// peer with the origin's rate, one peer per node, empty stores). Per scenario: first, median and last
// node ready, the registry's egress (bytes, copies of the layer, peak rate over 0.5 s), what each node
// received over its NIC, the Kumar–Ross bound T* for the bytes the scenario needs (the whole layer;
// for lazy, what the mounts fetched), the ratio, and the machine's CPU use.

import fsp from 'node:fs/promises';
import path from 'node:path';
import { makeTempDir, waitFor, type Service } from '../test/fixtures/processes.js';
import { blobBytesSent } from '../test/fixtures/registry.js';
import {
  clusterLowerBound,
  createCluster,
  hostEntry,
  nowSeconds,
  seedOf,
  startCpuSampler,
  tcpPayloadBytes,
  type Cluster,
  type CpuReport,
} from './lib/cluster.js';
import type { LowerBound } from './lib/lower-bound.js';
import { writeClusterPlots } from './lib/cluster-plots.js';
import { startEgressSampler } from './lib/egress.js';
import { debianImages, firstLayer, readFilesDigest, recordedPaths, rootfsPath, WORKLOAD } from './lib/debian-image.js';
import { startNsRegistry, type NsRegistry } from './lib/ns-registry.js';
import {
  armWholePulls,
  boundLine,
  cpuLine,
  scenarioArgs,
  startRates,
  startSpread,
  stringFlag,
  summarize,
  warnIfOverBudget,
  type NodeTiming,
} from './lib/scenario.js';
import { fixed, table } from './lib/stats.js';
import { MIRROR, startSwarm } from './lib/swarm.js';
import { itemAt } from '../src/common/indexing.js';

type Scenario = 'full' | 'lazy';
const LABELS: Record<Scenario, string> = { full: '(b) swarm, full download', lazy: '(c) swarm, lazy start' };
const READER = path.resolve(import.meta.dirname, 'lib/lazy-reader.ts');
const REPO = 'debian/python';
const TOC_DIGEST = 'containerd.io/snapshot/stargz/toc.digest';

const args = scenarioArgs(
  'swarm-lazy',
  {
    scenarios: { type: 'string', default: 'full,lazy', help: 'full (scenario b) and/or lazy (scenario c), in this order' },
    plots: { type: 'string', help: 'write a completion-time CDF and a registry-egress plot (SVG) there' },
    'keep-logs': { type: 'string', help: 'copy every process log there' },
    'peer-args': { type: 'string', default: '', help: "extra flags for every peer, the seed's included" },
    shape: { type: 'string', default: 'adaptive', help: "the scheduler's parent graph: adaptive (its default), mesh or pipeline" },
  },
  { nodeRate: '100mbit', size: null },
);
const N = args.nodes;
if (N > 64) throw new Error(`--nodes must be 1…64, got ${N}`);
const { nodeRate, originRate } = args;
if (args.rateChanges) throw new Error('swarm-lazy does not apply --rate-change');
const flags = { ...args.extra, 'json-out': args.jsonOut } as Record<string, string | undefined>;
const SCENARIOS = stringFlag(args.extra, 'scenarios')
  .split(',')
  .map((s) => s.trim()) as Scenario[];
for (const s of SCENARIOS) if (!(s in LABELS)) throw new Error(`--scenarios: unknown scenario "${s}" (full, lazy)`);
warnIfOverBudget(args);

interface ScenarioResult {
  scenario: Scenario;
  /** Bytes each node needs: the whole layer, or (lazy) the median of what the mounts fetched. */
  neededBytes: number;
  lowerBound: LowerBound;
  first: number;
  median: number;
  last: number;
  ratio: number;
  perNode: NodeTiming[];
  /** Lazy: seconds until each node's mount was ready (before reading the files). */
  mounted?: number[];
  /** Whole pulls: the latest a node's pull began after the start gate opened, in seconds. */
  startSpreadSeconds?: number;
  registryBytes: number;
  registryCopies: number;
  registryPeakBitsPerSecond: number;
  /** Registry NIC egress samples: seconds from the start, cumulative payload bytes. */
  egressSamples: Array<[number, number]>;
  /** Mean bytes received per node over its NIC (Ethernet payload), and as a share of the layer. */
  nodeReceivedBytes: number;
  nodeReceivedShare: number;
  cpu: CpuReport;
}

const work = await makeTempDir('starling-bench-swarm-lazy-');
let cluster: Cluster | undefined;
let registry: NsRegistry | undefined;
const services: Service[] = [];
const logFiles: string[] = [];
try {
  const images = await debianImages(work.path, true);
  const layer = await firstLayer(images.optimized, 'optimized');
  const tocDigest = layer.annotations?.[TOC_DIGEST];
  if (!tocDigest) throw new Error(`the optimized layer has no ${TOC_DIGEST} annotation`);
  const files = await recordedPaths(images.record);
  const expected = (await readFilesDigest(rootfsPath(), files)).digest;
  const F = layer.size;

  cluster = await createCluster({
    nodes: N,
    nodeRate: startRates(args.links),
    originRate,
    seed: { rate: originRate },
    extras: [{ name: 'sched' }],
  });
  const c = cluster;
  registry = await startNsRegistry(c, c.origin);
  await registry.pushBlobFile(REPO, path.join(images.optimized, 'blobs/sha256', layer.digest.slice(7)), layer.digest);
  const registryHost = `${c.origin.ip}:${registry.port}`;
  const url = `http://${MIRROR}/v2/${REPO}/blobs/${layer.digest}?ns=${registryHost}`;

  const results: ScenarioResult[] = [];
  for (const scenario of SCENARIOS) {
    const peerArgs = stringFlag(args.extra, 'peer-args').split(' ').filter(Boolean);
    const swarm = await startSwarm(c, {
      registryHost,
      workDir: work.path,
      tag: scenario,
      peerArgs,
      seedArgs: peerArgs,
      schedulerArgs: ['--shape', stringFlag(args.extra, 'shape')],
    });
    services.push(...swarm.services);
    logFiles.push(...swarm.logFiles());
    const readers: Service[] = [];
    const goFile = path.join(work.path, `${scenario}-go`);
    if (scenario === 'lazy') {
      // The readers load their code before the clock starts, then wait for the go file.
      for (const node of c.nodes) {
        const spec = {
          url,
          tocDigest,
          mountpoint: path.join(work.path, `mnt-${node.name}`),
          cacheDir: path.join(work.path, `cache-${node.name}`),
          files,
          goFile,
        };
        readers.push(
          await c.spawn(node, process.execPath, ['--import', 'tsx', READER, JSON.stringify(spec)], {
            name: `reader-${node.name}`,
            logFile: path.join(work.path, `${scenario}-reader-${node.name}.log`),
          }),
        );
      }
      services.push(...readers);
      logFiles.push(...readers.map((r) => r.logFile));
      await waitFor(
        () =>
          readers.every((r) => {
            if (!r.running) throw new Error(`${r.name} exited:\n${r.logTail()}`);
            return r.readLog().includes('ready');
          }),
        60_000,
        'every reader to load',
      );
    }

    // Whole pulls wait at a gate until every node's curl is spawned (armWholePulls), as in bench/swarm-cluster.ts.
    const pulls = scenario === 'full' ? await armWholePulls(c, c.nodes, url, F, layer.digest.slice('sha256:'.length)) : undefined;
    const registryLogBefore = blobBytesSent(registry.requests(), layer.digest);
    const countersBefore = await c.allCounters();
    const egress = await startEgressSampler(c, c.origin);
    const cpu = startCpuSampler(500, () => c.cpuSeconds());
    const t0 = nowSeconds();

    let timings: NodeTiming[];
    let mounted: number[] | undefined;
    let fetched: number[] = [];
    let startSpreadSeconds: number | undefined;
    if (!pulls) {
      // Written aside and renamed: a reader must never see the file before its content.
      await fsp.writeFile(`${goFile}.tmp`, String(Date.now()));
      await fsp.rename(`${goFile}.tmp`, goFile);
      const outcomes = await Promise.all(
        readers.map(async (reader, i) => {
          const exit = await reader.exited;
          const line = reader
            .readLog()
            .split('\n')
            .find((l) => l.startsWith('RESULT '));
          if (exit.code !== 0 || !line) throw new Error(`${reader.name} failed (${exit.code}):\n${reader.logTail()}`);
          const r = JSON.parse(line.slice(7)) as { mounted: number; done: number; fetched: number; digest: string };
          if (r.digest !== expected) throw new Error(`${reader.name}: the files read do not match the original rootfs`);
          return { node: itemAt(c.nodes, i).name, ...r };
        }),
      );
      timings = outcomes.map((o) => ({ node: o.node, done: o.done }));
      mounted = outcomes.map((o) => o.mounted);
      fetched = outcomes.map((o) => o.fetched);
    } else {
      const pulled = await pulls.release();
      timings = pulled.map(({ node, endedAt }) => ({ node: node.name, done: endedAt - t0 }));
      startSpreadSeconds = startSpread(pulled);
    }
    const cpuReport = cpu.stop();
    const egressRecord = await egress.stop();
    const countersAfter = await c.allCounters();
    const received = c.nodes.map((node) => {
      const b = hostEntry(countersBefore, node.name, 'link counters');
      const a = hostEntry(countersAfter, node.name, 'link counters');
      return tcpPayloadBytes(a.rxBytes - b.rxBytes, a.rxPackets - b.rxPackets);
    });
    const nodeReceivedBytes = received.reduce((x, y) => x + y, 0) / received.length;
    const neededBytes =
      scenario === 'lazy'
        ? itemAt(
            [...fetched].sort((x, y) => x - y),
            Math.floor(fetched.length / 2),
          )
        : F;
    const lowerBound = clusterLowerBound(neededBytes, seedOf(c), c.nodes);
    const s = summarize(timings);
    results.push({
      scenario,
      neededBytes,
      lowerBound,
      first: s.first,
      median: s.median,
      last: s.last,
      ratio: s.last / lowerBound.seconds,
      perNode: timings.map((t) => ({ node: t.node, done: +t.done.toFixed(3) })),
      mounted: mounted?.map((m) => +m.toFixed(3)),
      startSpreadSeconds,
      registryBytes: blobBytesSent(registry.requests(), layer.digest) - registryLogBefore,
      registryCopies: egressRecord.bytes / F,
      registryPeakBitsPerSecond: egressRecord.peakBitsPerSecond,
      egressSamples: egressRecord.samples,
      nodeReceivedBytes,
      nodeReceivedShare: nodeReceivedBytes / F,
      cpu: cpuReport,
    });
    console.error(`${LABELS[scenario]}: last node at ${fixed(s.last)} s (T* ${fixed(lowerBound.seconds)} s)`);
    console.error(`  ${boundLine(lowerBound)}`);
    console.error(`  ${cpuLine(cpuReport)}`);
    if (startSpreadSeconds !== undefined)
      console.error(`  every node's pull began within ${fixed(startSpreadSeconds, 3)} s of the start gate`);
    await swarm.stop();
  }

  const mb = (bytes: number) => `${(bytes / 1e6).toFixed(1)} MB`;
  console.log(
    `${N} nodes start \`${WORKLOAD.join(' ')}\` from an optimized eStargz image (layer ${mb(F)}, ${files.length} files recorded); nodes ${nodeRate}, registry and seed ${originRate}`,
  );
  console.log(
    table(
      [
        'scenario',
        'bytes needed',
        'T* s',
        'first s',
        'median s',
        'last s',
        'last/T*',
        'registry egress',
        'peak egress',
        'received per node',
      ],
      results.map((r) => [
        LABELS[r.scenario],
        mb(r.neededBytes),
        fixed(r.lowerBound.seconds),
        fixed(r.first),
        fixed(r.median),
        fixed(r.last),
        fixed(r.ratio),
        `${mb(r.registryCopies * F)} (${fixed(r.registryCopies)} copies)`,
        `${fixed(r.registryPeakBitsPerSecond / 1e6, 0)} Mbit/s`,
        `${mb(r.nodeReceivedBytes)} (${fixed(100 * r.nodeReceivedShare, 1)}%)`,
      ]),
    ),
  );
  for (const r of results) console.log(`${LABELS[r.scenario]}: ${cpuLine(r.cpu)}`);
  const json = {
    kind: 'swarm-lazy',
    shape: flags.shape,
    nodes: N,
    nodeRate,
    originRate,
    layerBytes: F,
    workload: WORKLOAD,
    recordedFiles: files.length,
    results,
  };
  console.log(JSON.stringify({ ...json, results: results.map(({ egressSamples: _, ...r }) => r) }));
  if (flags['json-out']) await fsp.writeFile(flags['json-out'], `${JSON.stringify(json, null, 1)}\n`);
  if (flags.plots) writePlots(flags.plots, results, `${N} nodes × ${nodeRate}, registry ${originRate}`);
} finally {
  for (const service of services.reverse()) await service.stop().catch(() => {});
  await registry?.stop().catch(() => {});
  await cluster?.destroy();
  if (flags['keep-logs']) {
    await fsp.mkdir(flags['keep-logs'], { recursive: true });
    for (const file of logFiles) await fsp.copyFile(file, path.join(flags['keep-logs'], path.basename(file))).catch(() => {});
  }
  await work.remove();
}

/** A completion-time CDF of both scenarios, and the registry's egress rate over time for each. */
function writePlots(dir: string, results: ScenarioResult[], setup: string): void {
  writeClusterPlots(
    path.join(dir, `emulated-${N}-nodes`),
    `${setup}: share of nodes ready (emulated cluster)`,
    results.map((r) => ({
      label: LABELS[r.scenario],
      done: r.perNode.map((p) => p.done),
      egressSamples: r.egressSamples,
      egressTitle: `${LABELS[r.scenario]}: registry egress, ${r.registryCopies.toFixed(2)} copies of the layer`,
    })),
    results.map((r) => ({ x: r.lowerBound.seconds, label: `T* ${r.scenario}` })),
  );
}
