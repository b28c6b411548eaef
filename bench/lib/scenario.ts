// What the cluster benchmarks (direct pull, BitTorrent baseline, later the Starling swarm)
// share: the command line, the budget check, the test blob, and the summary of a run.

import { writeFile } from 'node:fs/promises';
import { parseArgs } from 'node:util';
import { formatBitRate, parseBitRate, parseSize } from '../../src/common/units.js';
import type { CpuReport } from './cluster.js';
import type { LowerBound } from './lower-bound.js';
import { fixed, median } from './stats.js';

export interface ScenarioArgs {
  nodes: number;
  sizeBytes: number;
  sizeText: string;
  nodeRate: string;
  originRate: string;
  /** Extra options of the script, as given. */
  extra: Record<string, string | boolean | undefined>;
  /** --json-out: where the whole result (egress samples included) is written. */
  jsonOut?: string;
}

/** Total emulated traffic (Mbit/s) above which the two cores, not tc, set the pace (DESIGN.md: ~100 MB/s). */
export const BUDGET_MBIT = 800;

/**
 * --nodes 8 --size 16MiB --node-rate 20mbit --origin-rate <4 × node rate>, plus the
 * script's own options. Exits with a usage message on --help or bad input. `defaults` changes
 * the node rate's default, or (size: null) drops --size for a script whose blob is given.
 */
export function scenarioArgs(
  script: string,
  extraOptions: Record<string, { type: 'string' | 'boolean'; default?: string | boolean; help: string }> = {},
  defaults: { nodeRate?: string; size?: string | null } = {},
): ScenarioArgs {
  const nodeRate = defaults.nodeRate ?? '20mbit';
  const size = defaults.size === undefined ? '16MiB' : defaults.size;
  const options = {
    nodes: { type: 'string' as const, default: '8' },
    ...(size === null ? {} : { size: { type: 'string' as const, default: size } }),
    'node-rate': { type: 'string' as const, default: nodeRate },
    'origin-rate': { type: 'string' as const },
    'json-out': { type: 'string' as const },
    help: { type: 'boolean' as const, default: false },
    ...Object.fromEntries(Object.entries(extraOptions).map(([k, v]) => [k, { type: v.type, default: v.default }])),
  };
  const usage = () =>
    [
      `usage: npx tsx bench/${script}.ts [--nodes 8]${size === null ? '' : ` [--size ${size}]`} [--node-rate ${nodeRate}] [--origin-rate ${formatBitRate(4 * parseBitRate(nodeRate))}]`,
      '  --nodes N          receiving nodes (each in its own network namespace)',
      ...(size === null ? [] : ['  --size S           blob size (16MiB, 64MiB, 50MB…)']),
      '  --node-rate R      every node\'s NIC cap, both directions (tc units: mbit = 10^6 bit/s)',
      '  --origin-rate R    the origin\'s (registry / seeder) NIC cap; default 4 × node rate',
      '  --json-out FILE    write the result there as JSON, with the origin\'s egress samples (for bench/plot-cluster.ts)',
      ...Object.entries(extraOptions).map(([k, v]) => `  --${k.padEnd(16)} ${v.help}`),
    ].join('\n');
  let values: Record<string, string | boolean | undefined>;
  try {
    values = parseArgs({ options, strict: true }).values;
  } catch (err) {
    console.error(`${(err as Error).message}\n${usage()}`);
    process.exit(2);
  }
  if (values.help) {
    console.log(usage());
    process.exit(0);
  }
  try {
    const nodes = Number(values.nodes);
    if (!Number.isInteger(nodes) || nodes < 1 || nodes > 1000) throw new Error(`--nodes must be 1…1000, got ${values.nodes}`);
    const sizeText = size === null ? '' : String(values.size);
    const sizeBytes = size === null ? 0 : parseSize(sizeText);
    const nodeBits = parseBitRate(String(values['node-rate']));
    const originBits = values['origin-rate'] ? parseBitRate(String(values['origin-rate'])) : 4 * nodeBits;
    const extra: Record<string, string | boolean | undefined> = {};
    for (const k of Object.keys(extraOptions)) extra[k] = values[k];
    const jsonOut = values['json-out'] === undefined ? undefined : String(values['json-out']);
    return { nodes, sizeBytes, sizeText, nodeRate: formatBitRate(nodeBits), originRate: formatBitRate(originBits), extra, jsonOut };
  } catch (err) {
    console.error(`${(err as Error).message}\n${usage()}`);
    process.exit(2);
  }
}

/** Warn when the emulated traffic could exceed what two cores carry faithfully. */
export function warnIfOverBudget(a: ScenarioArgs): void {
  const total = Math.min(a.nodes * parseBitRate(a.nodeRate), parseBitRate(a.originRate) + a.nodes * parseBitRate(a.nodeRate)) / 1e6;
  if (total > BUDGET_MBIT) {
    console.error(
      `warning: up to ${total.toFixed(0)} Mbit/s of emulated traffic (N × node rate); above ~${BUDGET_MBIT} Mbit/s ` +
        '(100 MB/s) the CPU, not tc, sets the pace on this machine: lower --node-rate.',
    );
  }
}

export interface NodeTiming {
  node: string;
  /** Seconds from the common start to this node having the whole blob. */
  done: number;
}

export interface Summary {
  first: number;
  median: number;
  last: number;
}

export function summarize(t: NodeTiming[]): Summary {
  const done = t.map((x) => x.done);
  return { first: Math.min(...done), median: median(done), last: Math.max(...done) };
}

export function cpuLine(cpu: CpuReport): string {
  return (
    `CPU (whole machine, ${cpu.cpus} cores, ${fixed(cpu.seconds, 1)} s): mean ${fixed(cpu.meanBusyPct, 0)}% busy, ` +
    `peak ${fixed(cpu.maxBusyPct, 0)}% (0.5 s samples); this benchmark's processes ${fixed(cpu.ownPct, 0)}%; ` +
    `softirq ${fixed(cpu.softirqPct, 0)}%; per core ${cpu.perCpuMeanPct.map((p) => fixed(p, 0) + '%').join(' ')}`
  );
}

export function boundLine(lb: LowerBound): string {
  const t = lb.terms;
  return `T* = ${fixed(lb.seconds, 2)} s (${lb.binding} binds: F/u_s = ${fixed(t.source, 2)} s, F/d_min = ${fixed(t.download, 2)} s, N·F/(u_s+Σu_i) = ${fixed(t.aggregate, 2)} s)`;
}

/** Prints the result as one JSON line (without the egress samples) and writes it whole to --json-out. */
export async function reportJson(a: ScenarioArgs, result: { egress?: { samples: unknown } } & Record<string, unknown>): Promise<void> {
  const { egress, ...rest } = result;
  console.log(JSON.stringify(egress ? { ...rest, egress: { ...egress, samples: undefined } } : rest));
  if (a.jsonOut) await writeFile(a.jsonOut, `${JSON.stringify(result)}\n`);
}
