// The Starling simulator's command line.
//
//   npx tsx sim/main.ts --scenario p2p --nodes 64 --size 21.4GB --nic 50gbit --registry-uplink 25gbit
//   npx tsx sim/main.ts --seed-table            # the seed experiments at full scale, table + plots
//   npx tsx sim/main.ts --validate              # the emulated cluster's setups next to its measurements
//
// Every run drives the real scheduler (src/scheduler/scheduling.ts) with simulated peers,
// hosts and links; see sim/peer.ts and sim/network.ts for what is modelled and what is not.

import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { planNodeLinks } from '../bench/lib/link-plan.js';
import { seededRandom } from '../bench/lib/random.js';
import { writeBoundPlot } from '../bench/lib/cluster-plots.js';
import { boundRatioLines } from '../bench/lib/node-bounds.js';
import { defaultScheduling, shapeSchema } from '../src/scheduler/config.js';
import { pieceSizeFor } from '../src/storage/piece-plan.js';
import { DEFAULT_UPLOAD_SLOTS, defaultPeerSettings, MEASURED_SEED_UPLOAD_SLOTS } from './peer.js';
import {
  defaultLazy,
  defaultSetup,
  EFFICIENCY_ETHERNET,
  EFFICIENCY_TC,
  run,
  type LazyOptions,
  type RunResult,
  type ScenarioName,
  type Setup,
} from './scenario.js';
import { cdfPoints, lineChart, stackedCharts, type Series } from '../bench/lib/svg.js';
import { parseBitRate, parseSize } from '../src/common/units.js';
import { itemAt } from '../src/common/indexing.js';
import { median, table as plainTable } from '../bench/lib/stats.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

const options = {
  scenario: { type: 'string', default: 'p2p' },
  nodes: { type: 'string', default: '64' },
  size: { type: 'string', default: '21.4GB' },
  nic: { type: 'string', default: '50gbit' },
  'nic-up': { type: 'string' },
  'nic-down': { type: 'string' },
  'node-rate': { type: 'string' },
  'rate-change': { type: 'string', default: '' },
  'seed-nic': { type: 'string' },
  seeds: { type: 'string', default: '1' },
  'registry-uplink': { type: 'string', default: '25gbit' },
  'piece-size': { type: 'string' },
  'rack-size': { type: 'string', default: '32' },
  zones: { type: 'string', default: '1' },
  'rack-uplink': { type: 'string' },
  'zone-uplink': { type: 'string' },
  'latency-rack': { type: 'string', default: '50us' },
  'latency-cross-rack': { type: 'string', default: '150us' },
  'latency-cross-zone': { type: 'string', default: '1ms' },
  framing: { type: 'string', default: 'ethernet' },
  shape: { type: 'string', default: 'adaptive' },
  fanout: { type: 'string', default: '1' },
  'seed-fanout': { type: 'string', default: '1' },
  'parent-limit': { type: 'string', default: '5' },
  'back-to-source-limit': { type: 'string', default: '1' },
  'piece-parallelism': { type: 'string', default: '8' },
  'per-parent': { type: 'string', default: '3' },
  'upload-slots': { type: 'string', default: '8' },
  'seed-upload-slots': { type: 'string', default: '8' },
  noise: { type: 'string', default: '0' },
  'scheduler-log': { type: 'string', default: '' },
  quantum: { type: 'string', default: 'auto' },
  'start-spread': { type: 'string', default: '0' },
  runs: { type: 'string', default: '1' },
  'rng-seed': { type: 'string', default: '1' },
  'lazy-fraction': { type: 'string', default: '0.062' },
  'lazy-toc': { type: 'string', default: '4MiB' },
  'lazy-background': { type: 'boolean', default: false },
  'old-endgame': { type: 'boolean', default: false },
  'eager-endgame': { type: 'boolean', default: false },
  'store-and-forward': { type: 'boolean', default: false },
  'cold-start': { type: 'string', default: '0' },
  'origin-in-order': { type: 'boolean', default: false },
  'seed-table': { type: 'boolean', default: false },
  'seed-setups': { type: 'string' },
  validate: { type: 'boolean', default: false },
  'noise-sweep': { type: 'string', default: '0,0.1,0.2,0.3' },
  measured: { type: 'string', default: 'rerun' },
  plots: { type: 'string' },
  replot: { type: 'string' },
  markdown: { type: 'boolean', default: false },
  'json-out': { type: 'string' },
  help: { type: 'boolean', default: false },
} as const;

const USAGE = `usage:
  npx tsx sim/main.ts [--scenario direct|p2p|lazy|all] [--nodes 64] [--size 21.4GB] [--nic 50gbit]
                      [--registry-uplink 25gbit] [options]
  npx tsx sim/main.ts --seed-table [--runs 3] [--seed-setups 64x21.4GB,120x18.5GB,1000x21.4GB] [--noise 0]
                      [--plots docs/img] [--json-out FILE]
  npx tsx sim/main.ts --validate [--runs 5] [--noise-sweep 0,0.1,0.2,0.3] [--measured rerun|first]

setup
  --nic R / --nic-up R / --nic-down R   node NIC (tc units: 50gbit = 50e9 bit/s); default 50gbit
  --node-rate D          one link per node, as the emulated cluster's --node-rate (replaces --nic):
                         10gbit*24,3gbit*8 · 20gbit/5gbit*16,10gbit (down/up) · lognormal(50gbit,0.3)*95%,5gbit
                         (draws from --rng-seed)
  --rate-change C        links that change mid-run: n7=0.1x@2s, n3=1gbit@1.5s (seconds from the start)
  --seed-nic R           seed peer NIC (default: the nodes')     --seeds N        seed peers (default 1)
  --registry-uplink R    the registry's NIC (default 25gbit)     --piece-size S   default: as the peer picks
  --rack-size N          nodes per rack (32)   --zones N (1)     --rack-uplink R / --zone-uplink R  (none)
  --latency-rack T --latency-cross-rack T --latency-cross-zone T   one-way (50us, 150us, 1ms)
  --framing ethernet|tc  payload share of a link: 1448/1538 (Ethernet wire) or 1448/1514 (tc's count)
scheduler and peer (defaults are the real ones)
  --shape adaptive|mesh|pipeline (adaptive)  --fanout (1)  --seed-fanout (1)   chain children per node / per seed
  --parent-limit K (5)  --back-to-source-limit M (1)  --piece-parallelism (8)  --per-parent (3)
  --upload-slots (8)    --seed-upload-slots (8)
lazy start (scenario lazy)
  --lazy-fraction F (0.062)  --lazy-toc S (4MiB)  --lazy-background (fetch the rest after the start)
model
  --noise S        TCP share noise: flow weights exp(S·Z), Z ~ N(0,1); 0 = exact max-min fairness
  --scheduler-log L  the real scheduler's log at level L (debug: moves; trace: every parent change) on stderr,
                   one JSON line each, "t" in simulated seconds
  --quantum T|auto rate recomputation coalescing (auto: exact up to 128 nodes, else piece time / 20)
  --start-spread T nodes start at uniform random moments in [0, T]
  --old-endgame    the peer's endgame before its first fix (re-asked for pieces just stored)
  --eager-endgame  the peer's endgame before it waited for the tail (doubled pieces whenever idle)
  --store-and-forward  peers offer a piece only once stored (no cut-through relay, no PieceStarted)
  --origin-in-order    an origin read is one request from the first piece (not the last piece first)
  --cold-start T   each peer's first piece request reaches its parent T late (a fresh process on a loaded machine)
  --runs N --rng-seed S   repeat with seeds S, S+1, …
output
  --plots DIR      SVG plots (CDF of ready times, registry egress over time)
  --json-out FILE  every result as JSON
  --replot FILE    redraw the plots (into --plots DIR) from a --seed-table JSON file, without simulating
  --markdown       tables in Markdown`;

let args: Record<string, string | boolean | undefined>;
try {
  args = parseArgs({ options, strict: true }).values;
} catch (error) {
  console.error(`${(error as Error).message}\n${USAGE}`);
  process.exit(2);
}
if (args.help) {
  console.log(USAGE);
  process.exit(0);
}

function str(name: keyof typeof options): string {
  return String(args[name]);
}

/** '50us', '1.5ms', '2s', '0' → seconds. */
export function parseDuration(text: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(us|µs|ms|s)?\s*$/.exec(text);
  if (!m) throw new Error(`cannot read duration "${text}" (examples: 50us, 1ms, 2s)`);
  const unit = m[2] === 'us' || m[2] === 'µs' ? 1e-6 : m[2] === 'ms' ? 1e-3 : 1;
  return Number(m[1]) * unit;
}

function integer(name: keyof typeof options, min = 1): number {
  const value = Number(args[name]);
  if (!Number.isInteger(value) || value < min) throw new Error(`--${name} must be an integer ≥ ${min}, got ${args[name]}`);
  return value;
}

/** The setup the command line describes (nodes and size may be overridden by the caller). */
function setupFromArgs(overrides: Partial<Setup> = {}): Setup {
  const nic = parseBitRate(str('nic'));
  const up = args['nic-up'] ? parseBitRate(str('nic-up')) : nic;
  const down = args['nic-down'] ? parseBitRate(str('nic-down')) : nic;
  const seedNic = args['seed-nic'] ? parseBitRate(str('seed-nic')) : undefined;
  const scheduling = defaultScheduling();
  const shape = shapeSchema.safeParse(str('shape'));
  if (!shape.success) throw new Error(`--shape must be ${shapeSchema.options.join(' or ')}, got ${args.shape}`);
  scheduling.shape = shape.data;
  scheduling.pipeline = { fanout: integer('fanout'), seedFanout: integer('seed-fanout') };
  scheduling.candidateParentLimit = integer('parent-limit');
  scheduling.backToSourceLimit = integer('back-to-source-limit', 0);
  const setup = defaultSetup({
    nodes: integer('nodes'),
    size: parseSize(str('size')),
    pieceSize: args['piece-size'] ? parseSize(str('piece-size')) : undefined,
    nodeUp: up,
    nodeDown: down,
    seedUp: seedNic ?? up,
    seedDown: seedNic ?? down,
    seeds: integer('seeds', 0),
    registryUp: parseBitRate(str('registry-uplink')),
    rackSize: integer('rack-size'),
    zones: integer('zones'),
    rackUplink: args['rack-uplink'] ? parseBitRate(str('rack-uplink')) : undefined,
    zoneUplink: args['zone-uplink'] ? parseBitRate(str('zone-uplink')) : undefined,
    latency: {
      sameRack: parseDuration(str('latency-rack')),
      crossRack: parseDuration(str('latency-cross-rack')),
      crossZone: parseDuration(str('latency-cross-zone')),
    },
    efficiency: str('framing') === 'tc' ? EFFICIENCY_TC : EFFICIENCY_ETHERNET,
    scheduling,
    peer: {
      parallelism: integer('piece-parallelism'),
      perParent: integer('per-parent'),
      stall: 10,
      endgameRefetchesStored: Boolean(args['old-endgame']),
      eagerEndgame: Boolean(args['eager-endgame']),
      storeAndForward: Boolean(args['store-and-forward']),
      originInOrder: Boolean(args['origin-in-order']),
      coldStart: parseDuration(str('cold-start')),
    },
    uploadSlots: { node: integer('upload-slots'), seed: integer('seed-upload-slots') },
    rngSeed: integer('rng-seed', 0),
    startSpread: parseDuration(str('start-spread')),
    noise: Number(args.noise),
    schedulerLog: str('scheduler-log') || undefined,
    ...overrides,
  });
  if (!(setup.noise >= 0)) throw new Error(`--noise must be ≥ 0, got ${args.noise}`);
  if (args['node-rate']) {
    setup.links = planNodeLinks(str('node-rate'), setup.nodes, str('rate-change'), seededRandom(setup.rngSeed));
    // The seed's NIC defaults to the nodes': take the fastest node's.
    if (!seedNic) {
      setup.seedUp = Math.max(...setup.links.map((l) => l.steps[0].up));
      setup.seedDown = Math.max(...setup.links.map((l) => l.steps[0].down));
    }
  } else if (str('rate-change')) {
    throw new Error('--rate-change needs --node-rate (the links it changes)');
  }
  setup.quantum = quantumFor(setup);
  return setup;
}

function quantumFor(setup: Setup): number {
  const text = str('quantum');
  if (text !== 'auto') return parseDuration(text);
  if (setup.nodes <= 128) return 0;
  const pieceSize = setup.pieceSize ?? pieceSizeFor(setup.size);
  const fastest = setup.links ? Math.max(...setup.links.flatMap((l) => l.steps.map((s) => s.down))) : setup.nodeDown;
  return pieceSize / ((fastest / 8) * setup.efficiency) / 20;
}

function lazyFromArgs(): LazyOptions {
  return {
    ...defaultLazy(),
    fraction: Number(args['lazy-fraction']),
    tocBytes: parseSize(str('lazy-toc')),
    background: Boolean(args['lazy-background']),
  };
}

// ---------------------------------------------------------------- formatting

function duration(seconds: number): string {
  if (!Number.isFinite(seconds)) return 'n/a';
  if (seconds >= 3600) return `${Math.floor(seconds / 3600)} h ${String(Math.round((seconds % 3600) / 60)).padStart(2, '0')} min`;
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 2 : 1)} s`;
  const m = Math.floor(seconds / 60);
  const s = seconds - 60 * m;
  return `${m} min ${s.toFixed(0).padStart(2, '0')} s`;
}

function bytes(value: number): string {
  if (value >= 1e12) return `${(value / 1e12).toFixed(2)} TB`;
  if (value >= 1e9) return `${(value / 1e9).toFixed(1)} GB`;
  if (value >= 1e6) return `${(value / 1e6).toFixed(1)} MB`;
  return `${value.toFixed(0)} B`;
}

function gbps(bitsPerSecond: number): string {
  if (bitsPerSecond >= 1e9) return `${(bitsPerSecond / 1e9).toFixed(1)} Gbit/s`;
  return `${(bitsPerSecond / 1e6).toFixed(1)} Mbit/s`;
}

function table(header: string[], rows: string[][]): string {
  if (args.markdown) {
    const line = (cells: string[]) => `| ${cells.join(' | ')} |`;
    return [line(header), line(header.map(() => '---')), ...rows.map(line)].join('\n');
  }
  return plainTable(header, rows);
}

const SCENARIO_LABEL: Record<ScenarioName, string> = { direct: 'direct pull', p2p: 'P2P full download', lazy: 'P2P lazy (eStargz)' };

function describe(setup: Setup): string {
  const pieceSize = setup.pieceSize ?? pieceSizeFor(setup.size);
  return (
    `${setup.nodes} nodes × ${bytes(setup.size)} (${Math.ceil(setup.size / pieceSize)} pieces of ${pieceSize / 2 ** 20} MiB); ` +
    `node NIC ${setup.links ? `${args['node-rate']}${args['rate-change'] ? ` (changes ${args['rate-change']})` : ''}` : gbps(setup.nodeUp)}, ` +
    `${setup.seeds} seed (${gbps(setup.seedUp)}), registry ${gbps(setup.registryUp)}; ` +
    `${Math.ceil(setup.nodes / setup.rackSize)} racks, ${setup.zones} zone(s); payload share ${setup.efficiency.toFixed(3)}; ` +
    `noise ${setup.noise}; quantum ${(setup.quantum * 1e3).toFixed(3)} ms`
  );
}

function resultRow(r: RunResult): string[] {
  return [
    SCENARIO_LABEL[r.scenario],
    duration(r.first),
    duration(r.median),
    duration(r.last),
    `${bytes(r.registryBytesTotal)} (${(r.registryBytesTotal / r.size).toFixed(2)}×)`,
    gbps(r.registryPeakBps),
    `${((100 * r.writtenAtReady) / r.size).toFixed(1)}%`,
    duration(r.lowerBound.seconds),
    r.ratio.toFixed(2),
    `${r.ownBound.overall.median.toFixed(2)} / ${r.ownBound.overall.worst.toFixed(2)}`,
    r.scenario === 'direct' ? '—' : `${r.copiesFromSeeds.toFixed(2)} / ${r.copiesFromNodes.toFixed(2)}`,
    `${(r.wallMs / 1000).toFixed(1)} s`,
  ];
}

const RESULT_HEADER = [
  'scenario',
  'first ready',
  'median',
  'last ready',
  'registry egress',
  'peak',
  'written/node',
  'T*',
  'last/T*',
  'own bound: median / worst',
  'from seed / nodes',
  'wall',
];

function compact(r: RunResult): Record<string, unknown> {
  const { registrySamples, ready, bounds, groups, ...rest } = r;
  // One group name per node is long at 1000 nodes: the distinct names, and an index per node.
  const names = [...new Set(groups)];
  return {
    ...rest,
    ready: ready.map((t) => +t.toFixed(4)),
    bounds: bounds.map((t) => +t.toFixed(4)),
    groupNames: names,
    group: groups.map((g) => names.indexOf(g)),
    registrySamples: thin(registrySamples.map((s) => [+s.t.toFixed(4), Math.round(s.rate * 8)])),
  };
}

/** At most ~2000 points of a step series (enough for a plot). */
function thin<T>(points: T[], max = 2000): T[] {
  if (points.length <= max) return points;
  const step = points.length / max;
  const out: T[] = [];
  for (let i = 0; i < max; i++) out.push(itemAt(points, Math.floor(i * step)));
  out.push(itemAt(points, points.length - 1));
  return out;
}

function log(line: string): void {
  process.stdout.write(`${line}\n`);
}

// ---------------------------------------------------------------- plots

function writePlots(dir: string, name: string, title: string, results: RunResult[]): string[] {
  fs.mkdirSync(dir, { recursive: true });
  const lb = results.find((r) => r.scenario !== 'lazy')?.lowerBound.seconds ?? results[0]?.lowerBound.seconds;
  const cdf: Series[] = results.map((r) => ({ label: SCENARIO_LABEL[r.scenario], points: cdfPoints(r.ready), step: true }));
  const allReady = results.flatMap((r) => r.ready);
  const lo = Math.min(...allReady, lb ?? Infinity);
  const hi = Math.max(...allReady);
  const logX = hi / lo > 20;
  const cdfFile = path.join(dir, `sim-${name}-cdf.svg`);
  fs.writeFileSync(
    cdfFile,
    lineChart({
      title: `${title}: share of nodes ready (simulated)`,
      xLabel: `seconds from the start${logX ? ' (log scale)' : ''}`,
      yLabel: 'share of nodes ready',
      series: cdf,
      yMin: 0,
      yMax: 1,
      logX,
      xMin: logX ? lo / 1.5 : 0,
      xMax: logX ? hi * 1.5 : hi * 1.05,
      markers: lb ? [{ x: lb, label: 'T*' }] : [],
    }),
  );
  // Registry egress: one panel per scenario, each on its own time scale.
  const egressFile = path.join(dir, `sim-${name}-egress.svg`);
  fs.writeFileSync(
    egressFile,
    stackedCharts(
      results.map((r) => {
        const points = thin(r.registrySamples.map((s): [number, number] => [s.t, (s.rate * 8) / 1e9]));
        const last = points[points.length - 1];
        if (last) points.push([r.simulatedSeconds, last[1]]);
        return {
          title: `${title}, ${SCENARIO_LABEL[r.scenario]}: registry egress (${bytes(r.registryBytesTotal)} in all)`,
          xLabel: 'seconds from the start',
          yLabel: 'Gbit/s',
          series: [{ label: SCENARIO_LABEL[r.scenario], points, step: true }],
          yMin: 0,
          yMax: Math.max(1e-9, ...points.map((p) => p[1])) * 1.1,
          xMin: 0,
          xMax: r.simulatedSeconds * 1.02,
          height: 260,
          markers: [{ x: r.last, label: 'last ready' }],
        };
      }),
    ),
  );
  return [cdfFile, egressFile];
}

// ---------------------------------------------------------------- modes

interface SeedSetup {
  name: string;
  title: string;
  nodes: number;
  size: string;
  reported: Partial<Record<ScenarioName, string>>;
}

/** The seed experiments (DESIGN.md, issue 7). Registry and NICs: 2 × 25 Gbit/s nodes, a 25 Gbit/s registry. */
const SEED_SETUPS: SeedSetup[] = [
  {
    name: '64x21.4GB',
    title: '64 nodes × 21.4 GB',
    nodes: 64,
    size: '21.4GB',
    reported: {
      direct: '48.2 min; registry 24.5 Gbit/s; 100% written',
      p2p: '7.8 min; registry 2.1 Gbit/s',
      lazy: 'first 3.2 s, all 12.5 s; registry 0.4 Gbit/s; 6.2% written',
    },
  },
  {
    name: '120x18.5GB',
    title: '120 nodes × 18.5 GB',
    nodes: 120,
    size: '18.5GB',
    reported: { direct: '14 min 35 s (12 nodes timed out)', p2p: '38 s' },
  },
  { name: '1000x21.4GB', title: '1000 nodes × 21.4 GB', nodes: 1000, size: '21.4GB', reported: {} },
];

function runOne(scenario: ScenarioName, setup: Setup, lazy: LazyOptions): RunResult {
  return run(scenario, setup, lazy, (line) => process.stderr.write(`${line}\n`));
}

/**
 * The seed setups × the three scenarios. With --runs R each P2P scenario runs with R seeds; the
 * run with the median last-ready time stands for it in the table and the plots, and the range of
 * last/T* over the R runs is shown beside it.
 */
function seedTable(): void {
  const all: Record<string, unknown>[] = [];
  const rows: string[][] = [];
  const lazy = lazyFromArgs();
  const runs = integer('runs');
  const plotFiles: string[] = [];
  const only = args['seed-setups'] ? str('seed-setups').split(',') : undefined;
  for (const seed of SEED_SETUPS) {
    if (only && !only.includes(seed.name)) continue;
    const setup = setupFromArgs({ nodes: seed.nodes, size: parseSize(seed.size) });
    setup.quantum = quantumFor(setup);
    log(`\n## ${seed.title}: ${describe(setup)}`);
    const shown: RunResult[] = [];
    for (const scenario of ['direct', 'p2p', 'lazy'] as ScenarioName[]) {
      // Direct pulls involve no randomness: one run.
      const count = scenario === 'direct' ? 1 : runs;
      const results: RunResult[] = [];
      for (let k = 0; k < count; k++) {
        const r = runOne(scenario, { ...setup, rngSeed: setup.rngSeed + k }, lazy);
        results.push(r);
        log(table(RESULT_HEADER, [resultRow(r)]));
        const ticks = [...r.tickMs].sort((a, b) => a - b);
        const passes = ticks.length
          ? ` (periodic passes: median ${(median(ticks) / 1000).toFixed(2)} s, max ${(itemAt(ticks, ticks.length - 1) / 1000).toFixed(2)} s)`
          : '';
        log(
          `  rng seed ${setup.rngSeed + k}; scheduler: ${(r.schedulerMs / 1000).toFixed(1)} s in ${r.schedulerCalls} calls${passes}; ${r.events} events, ${r.recomputations} rate recomputations; ` +
            `429s ${r.busyAnswers}; duplicate piece bytes ${(r.duplicateBytes / r.size).toFixed(2)} copies, aborted transfers ${(r.abortedBytes / r.size).toFixed(2)} copies; seeds uploaded ${r.seedUploadCopies.toFixed(2)} copies`,
        );
      }
      const byLast = [...results].sort((a, b) => a.last - b.last);
      const r = itemAt(byLast, (byLast.length - 1) >> 1);
      shown.push(r);
      const ratios = results.map((x) => x.ratio);
      rows.push([
        seed.title,
        SCENARIO_LABEL[scenario],
        seed.reported[scenario] ?? '—',
        duration(r.first),
        duration(r.last),
        `${bytes(r.registryBytesTotal)}; peak ${gbps(r.registryPeakBps)}; mean ${gbps((8 * r.registryBytes) / r.last)}`,
        `${((100 * r.writtenAtReady) / r.size).toFixed(1)}%`,
        duration(r.lowerBound.seconds),
        r.ratio.toFixed(2) + (results.length > 1 ? ` (${Math.min(...ratios).toFixed(2)}–${Math.max(...ratios).toFixed(2)})` : ''),
        `${(r.wallMs / 1000).toFixed(0)} s`,
      ]);
      for (const x of results)
        all.push({ setup: seed.name, description: describe(setup), scheduler: schedulerVersion(), representative: x === r, ...compact(x) });
    }
    if (args.plots) plotFiles.push(...writePlots(str('plots'), seed.name, seed.title, shown));
  }
  log(
    `\n## The seed table (simulated Starling${runs > 1 ? `; P2P rows: the median of ${runs} runs by last-ready time, last/T* range in brackets` : ''}; the seed's reported figures for reference)`,
  );
  log(
    table(
      ['setup', 'scenario', 'seed reported', 'first ready', 'last ready', 'registry egress', 'written/node', 'T*', 'last/T*', 'wall'],
      rows,
    ),
  );
  if (plotFiles.length) log(`plots: ${plotFiles.map((f) => path.relative(ROOT, f)).join(', ')}`);
  if (args['json-out']) fs.writeFileSync(str('json-out'), JSON.stringify(all, null, 1));
}

interface MeasuredRun {
  nodes: number;
  seedUploadSlots?: number;
  first: number;
  median: number;
  last: number;
  lowerBound: number;
  fromSeedCopies?: number;
  fromNodesCopies?: number;
}

function validate(): void {
  const measured = JSON.parse(fs.readFileSync(path.join(ROOT, 'bench/results/emulated-cluster.json'), 'utf8')) as {
    swarm: { sizeBytes: number; commit: string; runs: MeasuredRun[] };
    swarmRerun: { sizeBytes: number; commit: string; runs: MeasuredRun[] };
    direct: { sizeBytes: number; runs: MeasuredRun[] };
  };
  // The measurements taken with the code the simulator now drives (see --measured).
  const set = str('measured') === 'first' ? measured.swarm : measured.swarmRerun;
  const runs = integer('runs');
  const noises = str('noise-sweep').split(',').map(Number);
  // The emulated cluster: one flat bridge (one rack), tc caps (tc counts 1514-byte frames), no
  // latency emulation (veth + bridge: tens of microseconds), the scheduler on an uncapped host.
  const base = (nodes: number, size: number, noise: number, rngSeed: number, seedSlots = MEASURED_SEED_UPLOAD_SLOTS): Setup =>
    defaultSetup({
      uploadSlots: { node: DEFAULT_UPLOAD_SLOTS.node, seed: seedSlots },
      nodes,
      size,
      nodeUp: 20e6,
      nodeDown: 20e6,
      seedUp: 80e6,
      seedDown: 80e6,
      registryUp: 80e6,
      rackSize: 1000,
      latency: { sameRack: 50e-6, crossRack: 50e-6, crossZone: 50e-6 },
      efficiency: EFFICIENCY_TC,
      quantum: 0,
      noise,
      rngSeed,
      // The measurements were taken with the endgame that re-fetched stored pieces, before the
      // cut-through relay, and before origin reads took the last piece first; in the mesh.
      peer: { ...defaultPeerSettings(), endgameRefetchesStored: true, storeAndForward: true, originInOrder: true },
      scheduling: { ...defaultScheduling(), shape: 'mesh' },
    });
  const rows: string[][] = [];
  const json: Record<string, unknown>[] = [];
  const within = (sim: number, real: number) => `${(((sim - real) / real) * 100).toFixed(0)}%`;
  for (const m of measured.direct.runs) {
    const r = run('direct', base(m.nodes, measured.direct.sizeBytes, 0, 1));
    rows.push([
      'direct pull 16 MiB',
      String(m.nodes),
      '—',
      fmt3(m.first, m.median, m.last),
      fmt3(r.first, r.median, r.last),
      within(r.last, m.last),
      within(r.median, m.median),
      '—',
      (r.registryBytesTotal / r.size).toFixed(2),
      '—',
    ]);
    json.push({ kind: 'direct', nodes: m.nodes, measured: m, simulated: { first: r.first, median: r.median, last: r.last } });
  }
  for (const noise of noises) {
    for (const m of set.runs) {
      const results = Array.from({ length: noise === 0 ? 1 : runs }, (_, k) =>
        run('p2p', base(m.nodes, set.sizeBytes, noise, 1 + k, m.seedUploadSlots)),
      );
      const med = (f: (r: RunResult) => number) => median(results.map(f));
      const [first, mid, last] = [med((r) => r.first), med((r) => r.median), med((r) => r.last)];
      const lastRange =
        results.length > 1
          ? ` [${Math.min(...results.map((r) => r.last)).toFixed(1)}–${Math.max(...results.map((r) => r.last)).toFixed(1)}]`
          : '';
      rows.push([
        `swarm 64 MiB, noise ${noise}${m.seedUploadSlots ? `, seed slots ${m.seedUploadSlots}` : ''}`,
        String(m.nodes),
        String(results.length),
        fmt3(m.first, m.median, m.last),
        fmt3(first, mid, last) + lastRange,
        within(last, m.last),
        within(mid, m.median),
        `${m.fromSeedCopies?.toFixed(2)} / ${m.fromNodesCopies?.toFixed(2)}`,
        `${med((r) => r.copiesFromSeeds).toFixed(2)} / ${med((r) => r.copiesFromNodes).toFixed(2)}`,
        med((r) => r.duplicateBytes / r.size).toFixed(2),
      ]);
      json.push({
        kind: 'swarm',
        nodes: m.nodes,
        noise,
        measured: m,
        simulated: results.map((r) => ({
          first: r.first,
          median: r.median,
          last: r.last,
          ratio: r.ratio,
          fromSeed: r.copiesFromSeeds,
          fromNodes: r.copiesFromNodes,
          duplicate: r.duplicateBytes / r.size,
          busy: r.busyAnswers,
        })),
      });
    }
  }
  log('Emulated cluster (measured, docs/benchmarks.md) against the simulator on the same setup');
  log(`swarm measurements: ${set.commit}; the simulator drives the scheduler as of ${schedulerVersion()}`);
  log('20 Mbit/s nodes, 80 Mbit/s registry (and seed), one bridge, tc framing (payload 1448/1514), 50 µs latency');
  log(
    table(
      [
        'setup',
        'N',
        'runs',
        'measured first / median / last s',
        'simulated first / median / last s',
        'last Δ',
        'median Δ',
        'measured seed / nodes copies',
        'simulated seed / nodes (direct: registry)',
        'wasted copies',
      ],
      rows,
    ),
  );
  log('wasted copies: piece bytes that reached a node that had stored the piece already (median, in copies of the blob)');
  log('the simulated peers use the endgame of the measured runs (it re-fetched pieces just stored)');
  if (args['json-out']) fs.writeFileSync(str('json-out'), JSON.stringify(json, null, 1));
}

/** The last commit that touched src/scheduler (and whether the checkout differs from it there). */
function schedulerVersion(): string {
  try {
    const commit = execFileSync('git', ['log', '-1', '--format=%h %s', '--', 'src/scheduler'], { cwd: ROOT, encoding: 'utf8' }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--', 'src/scheduler'], { cwd: ROOT, encoding: 'utf8' }).trim();
    return `${commit.slice(0, 90)}${dirty ? ' (+ uncommitted changes)' : ''}`;
  } catch {
    return 'unknown (no git)';
  }
}

function fmt3(a: number, b: number, c: number): string {
  return `${a.toFixed(1)} / ${b.toFixed(1)} / ${c.toFixed(1)}`;
}

function single(): void {
  const scenarios: ScenarioName[] = str('scenario') === 'all' ? ['direct', 'p2p', 'lazy'] : [str('scenario') as ScenarioName];
  for (const s of scenarios)
    if (!['direct', 'p2p', 'lazy'].includes(s)) throw new Error(`--scenario must be direct, p2p, lazy or all, got ${s}`);
  const setup = setupFromArgs();
  const lazy = lazyFromArgs();
  log(describe(setup));
  log(`scheduler: ${schedulerVersion()}`);
  const results: RunResult[] = [];
  const rows: string[][] = [];
  for (const scenario of scenarios) {
    for (let k = 0; k < integer('runs'); k++) {
      const r = runOne(scenario, { ...setup, rngSeed: setup.rngSeed + k }, lazy);
      results.push(r);
      rows.push(resultRow(r));
    }
  }
  log(table(RESULT_HEADER, rows));
  for (const r of results) {
    const ticks = [...r.tickMs].sort((a, b) => a - b);
    const passes = ticks.length
      ? ` (${ticks.length} periodic passes: median ${(median(ticks) / 1000).toFixed(2)} s, max ${(itemAt(ticks, ticks.length - 1) / 1000).toFixed(2)} s)`
      : '';
    log(
      `${SCENARIO_LABEL[r.scenario]}: T* ${r.lowerBound.seconds.toFixed(3)} s (${r.lowerBound.binding}); scheduler ${(r.schedulerMs / 1000).toFixed(1)} s in ${r.schedulerCalls} calls${passes}; ` +
        `${r.events} events, ${r.recomputations} rate recomputations; 429s ${r.busyAnswers}; duplicate piece bytes ${(r.duplicateBytes / r.size).toFixed(2)} copies, aborted transfers ${(r.abortedBytes / r.size).toFixed(2)} copies; ` +
        `seeds uploaded ${r.seedUploadCopies.toFixed(2)} copies; simulated ${r.simulatedSeconds.toFixed(1)} s in ${(r.wallMs / 1000).toFixed(1)} s`,
    );
    if (r.ownBound.groups.length > 1) for (const line of boundRatioLines(r.ownBound)) log(`  ${line}`);
  }
  if (args.plots) {
    const name = `${setup.nodes}x${bytes(setup.size).replace(/ /g, '')}`;
    const files = writePlots(str('plots'), name, `${setup.nodes} nodes × ${bytes(setup.size)}`, results);
    // Each node against its own bound, one file per shape (bench/plot-cluster.ts draws the emulated ones).
    const boundPrefix = path.join(str('plots'), `sim-${name}-${setup.scheduling.shape}`);
    writeBoundPlot(
      boundPrefix,
      `${setup.nodes} nodes × ${bytes(setup.size)}, ${setup.scheduling.shape}: nodes against their own bound (simulated)`,
      results.map((r) => ({
        label: SCENARIO_LABEL[r.scenario],
        perNode: r.ready.map((done, i) => ({ done, bound: itemAt(r.bounds, i), group: itemAt(r.groups, i) })),
      })),
    );
    log(`plots: ${[...files, `${boundPrefix}-own-bound.svg`].join(', ')}`);
  }
  if (args['json-out']) fs.writeFileSync(str('json-out'), JSON.stringify(results.map(compact), null, 1));
}

/** Redraws the seed table's plots from its JSON (the registry samples there are thinned). */
function replot(): void {
  if (!args.plots) throw new Error('--replot needs --plots DIR');
  const saved = JSON.parse(fs.readFileSync(str('replot'), 'utf8')) as Array<Record<string, unknown>>;
  for (const seed of SEED_SETUPS) {
    const results = saved
      .filter((r) => r.setup === seed.name && r.representative !== false)
      .map((r) => ({
        ...(r as unknown as RunResult),
        registrySamples: (r.registrySamples as Array<[number, number]>).map(([t, bits]) => ({ t, rate: bits / 8 })),
      }));
    if (results.length) log(`plots: ${writePlots(str('plots'), seed.name, seed.title, results).join(', ')}`);
  }
}

try {
  if (args.replot) replot();
  else if (args['seed-table']) seedTable();
  else if (args.validate) validate();
  else single();
} catch (error) {
  console.error(`sim: ${(error as Error).message}`);
  process.exit(1);
}
