// The seed experiment end to end: N emulated nodes (network namespaces with capped links), each with
// its own containerd + runc, Starling peer and Starling snapshotter (with its FUSE server), a
// docker-registry behind its own capped link, a scheduler and a seed peer. Every node pulls the same
// multi-layer image and runs its workload; each row is timed from "pull requested on every node" to
// the workload's ready line on each node (bench/lib/e2e-rows.ts has the rows):
//   (a) direct `ctr images pull`; (b) through the swarm; (c) eStargz through the snapshotter and the
//   swarm; (d) the snapshotter reading the registry directly; (c-no-bg) (c) without background fetch.
//
//   npx tsc -p . && npx tsx bench/e2e-cluster.ts --nodes 8 [--rows a,b,c,d] [--node-rate 50mbit] [--origin-rate 200mbit]
//     [--model-size 256MiB] [--shard-size 4MiB] [--shards-loaded 4] [--image debian|busybox] [--shape adaptive|mesh|pipeline]
//     [--json-out FILE] [--plots DIR] [--keep-logs DIR] [--log-level debug]
//
// The image (bench/lib/e2e-image.ts, cached in /var/tmp): Debian bookworm minbase, python3, a model
// of random shards and an app layer whose serve.py imports modules, loads the first shards and prints
// `ready <sha256>`; converted by `starling optimize` (its reads recorded) for the lazy rows. The first
// run debootstraps two root file systems and builds the image: minutes.
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { makeTempDir } from '../test/fixtures/processes.js';
import { writeClusterPlots } from './lib/cluster-plots.js';
import { busyboxModelImage, debianModelImage, type WorkloadImage } from './lib/e2e-image.js';
import { parseRows, runRow, startE2eCluster, type RowName, type RowResult } from './lib/e2e-rows.js';
import { cpuLine, scenarioArgs, stringFlag, warnIfOverBudget } from './lib/scenario.js';
import { parseSize } from '../src/common/units.js';
import { fixed, median, table } from './lib/stats.js';

/** The seed articles' ratios at 64 nodes × 21.4 GB: direct / lazy P2P and full P2P / lazy P2P, last node. */
const SEED_RATIOS = { direct: 231, p2p: 37 };

const args = scenarioArgs(
  'e2e-cluster',
  {
    rows: { type: 'string', default: 'a,b,c,d', help: 'rows to run, in this order: a, b, c, d, c-no-bg' },
    image: { type: 'string', default: 'debian', help: 'debian (Debian + python3 + model + app) or busybox (small, for a quick try)' },
    'model-size': { type: 'string', default: '256MiB', help: 'the model layer: total size of its shards' },
    'shard-size': { type: 'string', default: '4MiB', help: 'size of one model shard' },
    'shards-loaded': { type: 'string', default: '4', help: 'shards the workload loads before its ready line' },
    shape: {
      type: 'string',
      default: 'adaptive',
      help: "the scheduler's parent graph: adaptive (the scheduler's default), mesh or pipeline",
    },
    'snapshotter-config': { type: 'string', help: 'more YAML for every snapshotter, e.g. "prefetch: {resolveAhead: false}"' },
    plots: { type: 'string', help: 'write the completion CDFs and the registry egress over time (SVG) there' },
    'keep-logs': { type: 'string', help: "copy every node's and every process's logs there" },
    'log-level': {
      type: 'string',
      help: 'log level of the scheduler, the seed and every peer (default: info, warn, warn), e.g. debug with --keep-logs',
    },
  },
  { nodeRate: '50mbit', size: null },
);
const flags = args.extra as Record<string, string | undefined>;
const N = args.nodes;
if (N > 64) throw new Error(`--nodes must be 1…64, got ${N}`);
const rows = parseRows(stringFlag(args.extra, 'rows'));
warnIfOverBudget(args);
const modelOptions = {
  modelBytes: parseSize(stringFlag(args.extra, 'model-size')),
  shardBytes: parseSize(stringFlag(args.extra, 'shard-size')),
  shardsLoaded: Number(flags['shards-loaded']),
};
if (flags.image !== 'debian' && flags.image !== 'busybox') throw new Error(`--image must be debian or busybox, got "${flags.image}"`);
if (flags.shape !== 'mesh' && flags.shape !== 'pipeline' && flags.shape !== 'adaptive')
  throw new Error(`--shape must be mesh, pipeline or adaptive, got "${flags.shape}"`);

const logLevel = flags['log-level'] ? ['--log-level', flags['log-level']] : [];

const loadBefore = loadAverage();
const image: WorkloadImage = flags.image === 'debian' ? await debianModelImage(modelOptions) : await busyboxModelImage(modelOptions);
const work = await makeTempDir('starling-bench-e2e-');
const results: RowResult[] = [];
let context: Awaited<ReturnType<typeof startE2eCluster>> | undefined;
try {
  context = await startE2eCluster(image, { nodes: N, nodeRate: args.nodeRate, originRate: args.originRate, workDir: work.path });
  for (const row of rows) {
    const result = await runRow(
      {
        ...context,
        schedulerArgs: ['--shape', flags.shape, ...logLevel],
        peerArgs: logLevel,
        snapshotterConfig: flags['snapshotter-config'],
        log: (line) => console.error(line),
      },
      row,
    );
    results.push(result);
    console.error(
      `${result.label}: first ${fixed(result.firstSeconds)} s, median ${fixed(result.medianSeconds)} s, last ${fixed(result.lastSeconds)} s; every pull began within ${fixed(result.startSpreadSeconds, 3)} s of the start gate; ${cpuLine(result.cpu)}`,
    );
  }
} finally {
  await context?.stop();
  if (flags['keep-logs']) await keepLogs(work.path, flags['keep-logs']);
  await work.remove();
}
const loadAfter = loadAverage();
report(results);

function report(results: RowResult[]): void {
  const mb = (bytes: number) => `${(bytes / 1e6).toFixed(1)} MB`;
  const byRow = (row: RowName) => results.find((r) => r.row === row);
  console.log(
    `${N} nodes × ${args.nodeRate}, registry and seed ${args.originRate}, scheduler shape ${flags.shape}; image ${image.name}: ` +
      `plain ${mb(image.plain.bytes)} in ${image.plain.layers.length} layers, eStargz ${mb(image.lazy.bytes)}, a lazy start needs ${mb(image.lazy.neededBytes)} ` +
      `(${image.recordedFiles} files recorded; prefetch ranges, TOCs and footers); load average ${loadBefore} before, ${loadAfter} after`,
  );
  console.log(
    table(
      [
        'row',
        'first s',
        'median s',
        'last s',
        'registry until last ready',
        'read per node',
        'disk per node',
        'whole image, last node',
        'CPU busy / ours',
      ],
      results.map((r) => [
        r.label,
        fixed(r.firstSeconds),
        fixed(r.medianSeconds),
        fixed(r.lastSeconds),
        `${mb(r.registryBytes)} (${fixed(r.registryCopies)} × needed)`,
        `${mb(median(r.readBytesPerNode))} (${fixed((100 * median(r.readBytesPerNode)) / r.imageBytes, 1)}%)`,
        `${mb(median(r.diskBytesPerNode))} (${fixed((100 * median(r.diskBytesPerNode)) / r.imageBytes, 1)}%)`,
        r.lastWholeImageSeconds === undefined ? '-' : `${fixed(r.lastWholeImageSeconds)} s`,
        `${fixed(r.cpu.meanBusyPct, 0)}% / ${fixed(r.cpu.ownPct, 0)}%`,
      ]),
    ),
  );
  const ratios: Record<string, number> = {};
  const a = byRow('a');
  const b = byRow('b');
  const c = byRow('c');
  if (a && c) ratios.directOverLazy = a.lastSeconds / c.lastSeconds;
  if (b && c) ratios.p2pOverLazy = b.lastSeconds / c.lastSeconds;
  if (ratios.directOverLazy)
    console.log(`(a)/(c), last node: ${fixed(ratios.directOverLazy, 1)}× (seed: ${SEED_RATIOS.direct}× at 64 nodes × 21.4 GB)`);
  if (ratios.p2pOverLazy) console.log(`(b)/(c), last node: ${fixed(ratios.p2pOverLazy, 1)}× (seed: ${SEED_RATIOS.p2p}×)`);
  const goals = c ? lazyGoals(c, b) : [];
  for (const goal of goals) console.log(`goal: ${goal.text}: ${goal.met ? 'met' : 'NOT met'} (${goal.measured})`);
  for (const r of results) {
    console.log(`${r.label}: ${cpuLine(r.cpu)}`);
    console.log(
      `${r.label}, CPU seconds by program until the last ready line: ${Object.entries(r.cpuSecondsByProgram)
        .slice(0, 10)
        .map(([p, s]) => `${p} ${fixed(s, 1)}`)
        .join(', ')}`,
    );
    if (r.cpuAfterReady) console.log(`${r.label}, after the last ready line: ${cpuLine(r.cpuAfterReady)}`);
  }
  const json = {
    kind: 'e2e-cluster',
    nodes: N,
    nodeRate: args.nodeRate,
    originRate: args.originRate,
    shape: flags.shape,
    snapshotterConfig: flags['snapshotter-config'],
    loadAverage: { before: loadBefore, after: loadAfter },
    image: {
      name: image.name,
      plainBytes: image.plain.bytes,
      lazyBytes: image.lazy.bytes,
      neededBytes: image.lazy.neededBytes,
      layers: image.lazy.layers.length,
      recordedFiles: image.recordedFiles,
    },
    rows: results,
    ratios,
    seedRatios: SEED_RATIOS,
    goals,
  };
  console.log(JSON.stringify({ ...json, rows: results.map(({ egressSamples: _, nodes: __, ...r }) => r) }));
  if (args.jsonOut) fs.writeFileSync(args.jsonOut, `${JSON.stringify(json)}\n`);
  if (flags.plots) {
    const lazy = c ?? byRow('c-no-bg') ?? byRow('d');
    const markers = lazy
      ? [
          { x: linkSeconds(lazy), label: 'link time, bytes needed' },
          { x: 2 * linkSeconds(lazy), label: '2 × that' },
        ]
      : [];
    writeClusterPlots(
      path.join(flags.plots, `e2e-${N}-nodes`),
      `${N} nodes × ${args.nodeRate}, registry ${args.originRate}: share of nodes whose workload is ready`,
      results.map((r) => ({
        label: r.label,
        done: r.nodes.map((n) => n.readySeconds),
        egressSamples: r.egressSamples,
        egressTitle: `${r.label}: registry egress, ${fixed(r.registryBytesTotal / r.imageBytes)} copies of the image in all`,
      })),
      markers,
    );
  }
}

/** Seconds a node's own link needs for the bytes a lazy start needs. */
function linkSeconds(r: RowResult): number {
  return (8 * r.neededBytes) / r.nodeLinkBitsPerSecond;
}

/** Issue 22's goals for row (c), with what was measured. */
function lazyGoals(c: RowResult, b: RowResult | undefined): Array<{ text: string; met: boolean; measured: string }> {
  const goals = [
    {
      text: "(c) last node within 2 × its link's time for the bytes needed (prefetch ranges, TOCs, footers)",
      met: c.lastSeconds <= 2 * linkSeconds(c),
      measured: `${fixed(c.lastSeconds)} s against ${fixed(2 * linkSeconds(c))} s (link time ${fixed(linkSeconds(c))} s for ${(c.neededBytes / 1e6).toFixed(1)} MB)`,
    },
    {
      text: '(c) registry sends at most 1.05 copies of those bytes by the last ready line',
      met: c.registryCopies <= 1.05,
      measured: `${fixed(c.registryCopies)} copies`,
    },
  ];
  if (b) {
    const want = (0.5 * c.imageBytes) / c.neededBytes;
    goals.push({
      text: '(c) faster than (b) by at least half of image size / bytes needed',
      met: b.lastSeconds / c.lastSeconds >= want,
      measured: `${fixed(b.lastSeconds / c.lastSeconds, 1)}× against ${fixed(want, 1)}×`,
    });
  }
  return goals;
}

function loadAverage(): string {
  return fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
}

/** Copies every *.log under the work dir, named after its path. */
async function keepLogs(from: string, to: string): Promise<void> {
  await fsp.mkdir(to, { recursive: true });
  const walk = async (dir: string): Promise<void> => {
    for (const entry of await fsp.readdir(dir, { withFileTypes: true }).catch(() => [])) {
      const p = path.join(dir, entry.name);
      if (entry.isDirectory() && !entry.isSymbolicLink()) await walk(p);
      else if (entry.isFile() && entry.name.endsWith('.log'))
        await fsp.copyFile(p, path.join(to, path.relative(from, p).replaceAll('/', '_'))).catch(() => {});
    }
  };
  await walk(from);
}
