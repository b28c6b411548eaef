// What the cluster benchmarks (direct pull, BitTorrent baseline, later the Starling swarm)
// share: the command line, the budget check, the test blob, and the summary of a run.

import { spawn } from 'node:child_process';
import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { formatBitRate, parseBitRate, parseSize } from '../../src/common/units.js';
import { nowSeconds, type Cluster, type ClusterHost, type CpuReport } from './cluster.js';
import type { LowerBound } from './lower-bound.js';
import { formatLink, planNodeLinks, type NodeLink } from './link-plan.js';
import { boundRatioLines, boundRatios, nodeBounds, type BoundRatios } from './node-bounds.js';
import { fixed, median } from './stats.js';
import { itemAt } from '../../src/common/indexing.js';

export interface ScenarioArgs {
  nodes: number;
  sizeBytes: number;
  sizeText: string;
  /** The --node-rate description (bench/lib/link-plan.ts), e.g. '10mbit' or '10mbit*24,3mbit*8'. */
  nodeRate: string;
  /** Each node's link over the run, from --node-rate and --rate-change. */
  links: NodeLink[];
  /** The --rate-change text ('' for none). */
  rateChanges: string;
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
    'rate-change': { type: 'string' as const, default: '' },
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
      "  --node-rate R      the nodes' NIC caps (tc units: mbit = 10^6 bit/s): one rate for all, both directions,",
      '                     or groups in node order, e.g. 10mbit*24,3mbit*8 or 20mbit/5mbit*16,10mbit (down/up)',
      '  --rate-change C    links that change during the run, e.g. n7=1mbit@20s or n7=0.1x@20s (seconds from the start)',
      "  --origin-rate R    the origin's (registry / seeder) NIC cap; default 4 × the fastest node's download",
      "  --json-out FILE    write the result there as JSON, with the origin's egress samples (for bench/plot-cluster.ts)",
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
    const rateChanges = String(values['rate-change']);
    const links = planNodeLinks(String(values['node-rate']), nodes, rateChanges);
    const fastest = Math.max(...links.map((l) => l.steps[0].down));
    const originBits = values['origin-rate'] ? parseBitRate(String(values['origin-rate'])) : 4 * fastest;
    const extra: Record<string, string | boolean | undefined> = {};
    for (const k of Object.keys(extraOptions)) extra[k] = values[k];
    const jsonOut = values['json-out'] === undefined ? undefined : String(values['json-out']);
    // One rate for every node is written as before ('20mbit'); a description stays as given.
    const first = formatLink(itemAt(links, 0).steps[0]);
    const uniform = links.every((l) => l.steps.length === 1 && formatLink(l.steps[0]) === first);
    const nodeRateText = uniform && !/[*/,]/.test(String(values['node-rate'])) ? first : String(values['node-rate']);
    return {
      nodes,
      sizeBytes,
      sizeText,
      nodeRate: nodeRateText,
      links,
      rateChanges,
      originRate: formatBitRate(originBits),
      extra,
      jsonOut,
    };
  } catch (err) {
    console.error(`${(err as Error).message}\n${usage()}`);
    process.exit(2);
  }
}

/** The value of one of a script's own string options (one with a default always has one). */
export function stringFlag(extra: ScenarioArgs['extra'], name: string): string {
  const value = extra[name];
  if (typeof value !== 'string') throw new Error(`--${name} needs a value`);
  return value;
}

/** Each node's caps at the start, as createCluster takes them. */
export function startRates(links: NodeLink[]): Array<{ up: number; down: number }> {
  return links.map((l) => ({ up: l.steps[0].up, down: l.steps[0].down }));
}

/**
 * Changes the nodes' caps at the seconds --rate-change gives, counted from `t0` (nowSeconds()).
 * stop() cancels those not yet made and says when each one made was in place.
 */
export function startRateChanges(
  c: Cluster,
  links: NodeLink[],
  t0: number,
  now: () => number,
): { stop(): Promise<Array<{ node: string; at: number; inPlace: number }>> } {
  const timers: NodeJS.Timeout[] = [];
  const made: Array<Promise<{ node: string; at: number; inPlace: number }>> = [];
  links.forEach((link, i) => {
    for (const step of link.steps.slice(1)) {
      const node = itemAt(c.nodes, i);
      timers.push(
        setTimeout(
          () => {
            made.push(
              c.setRate(node, { up: step.up, down: step.down }).then(() => ({ node: node.name, at: step.at, inPlace: now() - t0 })),
            );
          },
          Math.max(0, (t0 + step.at - now()) * 1000),
        ),
      );
    }
  });
  return {
    async stop() {
      for (const t of timers) clearTimeout(t);
      return Promise.all(made);
    },
  };
}

/** Warn when the emulated traffic could exceed what two cores carry faithfully. */
export function warnIfOverBudget(a: ScenarioArgs): void {
  const nodesDown = a.links.reduce((sum, l) => sum + Math.max(...l.steps.map((s) => s.down)), 0);
  const total = Math.min(nodesDown, parseBitRate(a.originRate) + nodesDown) / 1e6;
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

/**
 * Each node's completion beside its own bound (bench/lib/node-bounds.ts): `timings` in node
 * order, the source being the seed (or the origin) uploading `sourceUpBits`.
 */
export function againstOwnBounds(
  timings: NodeTiming[],
  links: NodeLink[],
  F: number,
  sourceUpBits: number,
): { perNode: Array<{ node: string; done: number; bound: number; group: string }>; ownBound: BoundRatios; lines: string[] } {
  const bounds = nodeBounds(F, sourceUpBits, links);
  const perNode = timings.map((t, i) => ({
    node: t.node,
    done: +t.done.toFixed(3),
    bound: +itemAt(bounds, i).seconds.toFixed(3),
    group: itemAt(links, i).group,
  }));
  const ownBound = boundRatios(perNode);
  return { perNode, ownBound, lines: boundRatioLines(ownBound) };
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

/** One node's pull of the whole blob, started at the gate (see armWholePulls). */
export interface WholePull {
  node: ClusterHost;
  /** When its curl exited (nowSeconds). */
  endedAt: number;
  /** curl's own transfer time. */
  curlSeconds: number;
  /** How long after the gate opened its shell went on (bash's clock against this process's). */
  startDelay: number;
}

/** What armWholePulls hands back: the pulls wait until `release`, which resolves when every one has ended. */
export interface ArmedPulls {
  release(): Promise<WholePull[]>;
}

/** What a gated shell prints once the gate lets it go: its clock (bash's), read back by wentOnAt. */
const GO_LINE = 'echo "GO $EPOCHREALTIME"';

/** When a gated shell went on (epoch seconds), from its output's GO line; NaN without one. */
function wentOnAt(output: string): number {
  return Number(/^GO (\d+(?:\.\d+)?)$/m.exec(output)?.[1] ?? NaN);
}

/** How long the nodes' shells may take to reach the gate before the run is called off. */
const GATE_TIMEOUT_MS = 120_000;

/** How long a pull may take once released before it is killed (and the run fails). */
const PULL_TIMEOUT_MS = 3_600_000;

/** What a command armed at the start gate left when it exited (see armGated). */
export interface GatedExit {
  node: ClusterHost;
  code: number | null;
  stdout: string;
  /** Its stderr after the gate's READY line (its GO line first). */
  stderr: string;
  /** When it exited (nowSeconds). */
  endedAt: number;
  /** How long after the gate opened its shell went on (bash's clock against this process's). */
  startDelay: number;
}

/** Commands waiting at the start gate: `release` lets them all go at once and hands back each one's exit, in the order armed. */
export interface ArmedCommands {
  release(): Array<Promise<GatedExit>>;
}

/**
 * Runs each command (`bash -c script args…` in its node's namespace) only once every one of them
 * is spawned and waits: each shell prints READY and waits on its stdin; `release` sends each a
 * newline. (Spawned one after another while the swarm already ran, the last of 32 nodes' pulls
 * began 22 s after the first on a busy 2-core machine, 52 s in another run, and the last nodes'
 * times counted that wait: the eighteenth round of docs/benchmarks.md.) A command still running
 * PULL_TIMEOUT_MS after the gate opened is killed.
 */
export async function armGated(c: Cluster, commands: Array<{ node: ClusterHost; script: string; args: string[] }>): Promise<ArmedCommands> {
  const waiting = commands.map(({ node, script, args }) =>
    gatedShell(c, node, `echo READY >&2; read -r _ || exit 90; ${GO_LINE} >&2; ${script}`, args),
  );
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`the commands did not all reach the start gate in ${GATE_TIMEOUT_MS / 1000} s`)),
      GATE_TIMEOUT_MS,
    );
  });
  try {
    await Promise.race([Promise.all(waiting.map((w) => w.ready)), timeout]);
  } catch (error) {
    for (const w of waiting) w.child.kill('SIGKILL');
    throw error;
  } finally {
    clearTimeout(timer);
  }
  return {
    release: () => {
      const opened = Date.now() / 1000;
      for (const w of waiting) w.child.stdin?.end('\n');
      const deadline = setTimeout(() => {
        for (const w of waiting) w.child.kill('SIGKILL');
      }, PULL_TIMEOUT_MS);
      const exits = waiting.map(async ({ node, ended }) => {
        const exit = await ended;
        return { node, ...exit, startDelay: wentOnAt(exit.stderr) - opened };
      });
      void Promise.allSettled(exits).then(() => clearTimeout(deadline));
      return exits;
    },
  };
}

/**
 * Every node downloads `url` with curl inside its namespace, all starting at one moment (armGated).
 * What arrives is hashed: a short body or a wrong digest fails the run, not just this data point.
 */
export async function armWholePulls(c: Cluster, nodes: ClusterHost[], url: string, size: number, sha256: string): Promise<ArmedPulls> {
  const script = `set -o pipefail; curl -sS --fail --noproxy '*' -w '%{stderr}RESULT %{http_code} %{size_download} %{time_total}\\n' "$0" | sha256sum`;
  const armed = await armGated(
    c,
    nodes.map((node) => ({ node, script, args: [url] })),
  );
  return {
    release: () =>
      Promise.all(
        armed.release().map(async (exit) => {
          const { node, code, stdout, stderr, endedAt, startDelay } = await exit;
          const m = /RESULT (\d+) (\d+) ([\d.]+)/.exec(stderr);
          if (code !== 0 || !m || Number(m[2]) !== size) throw new Error(`${node.name}: bad transfer (exit ${code}): ${stderr.trim()}`);
          const got = stdout.trim().split(/\s+/)[0];
          if (got !== sha256) throw new Error(`${node.name}: sha256 ${got}, expected ${sha256}`);
          return { node, endedAt, curlSeconds: Number(m[3]), startDelay };
        }),
      ),
  };
}

/** A start gate for clients that run as the cluster's services (holdStartGate). */
export interface StartGate {
  /** bash argv that prints READY, waits for the gate, prints `GO <epoch seconds>` and runs `cmd args`. */
  gated(cmd: string, args: string[]): string[];
  /** Once every log shows READY, opens the gate; resolves to when it opened (epoch seconds). */
  open(logFiles: string[]): Promise<number>;
  /** The latest any client went on after the gate opened at `openedAt`, read from the GO lines of the logs. */
  spread(logFiles: string[], openedAt: number): Promise<number>;
  /** Lets go of the lock if the gate was never opened. */
  close(): void;
}

/**
 * A gate for long-running clients (aria2c leechers) that are the run's services, not one-shot
 * pulls: each waits on a shared flock(1) of a file under `dir` while this process holds it
 * exclusively (the namespaces share the filesystem); opening the gate lets go of it and every
 * client goes on at once. The same reason as armWholePulls: spawned one by one, the last started late.
 */
export async function holdStartGate(dir: string): Promise<StartGate> {
  const lock = path.join(dir, 'start-gate.lock');
  await writeFile(lock, '');
  const holder = spawn('flock', ['-x', lock, '-c', 'echo HELD; read -r _'], { stdio: ['pipe', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => {
    let out = '';
    holder.stdout.on('data', (chunk: Buffer) => {
      out += chunk.toString('utf8');
      if (out.startsWith('HELD')) resolve();
    });
    holder.once('error', (error) => reject(new Error(`cannot hold the start gate's lock: ${error.message}`)));
    holder.once('exit', (code) => reject(new Error(`flock exited (${code}) before holding the start gate's lock`)));
  });
  const readAll = (files: string[]) => Promise.all(files.map((file) => readFile(file, 'utf8').catch(() => '')));
  return {
    gated: (cmd, args) => ['-c', `echo READY; flock -s "$0" true || exit 90; ${GO_LINE}; exec "$@"`, lock, cmd, ...args],
    async open(logFiles) {
      const deadline = Date.now() + GATE_TIMEOUT_MS;
      for (;;) {
        const logs = await readAll(logFiles);
        if (logs.every((log) => log.includes('READY\n'))) break;
        if (Date.now() > deadline) throw new Error(`the clients did not all reach the start gate in ${GATE_TIMEOUT_MS / 1000} s`);
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      const openedAt = Date.now() / 1000;
      holder.stdin.end();
      return openedAt;
    },
    async spread(logFiles, openedAt) {
      return Math.max(0, ...(await readAll(logFiles)).map((log) => wentOnAt(log) - openedAt));
    },
    close: () => holder.kill(),
  };
}

/** The latest any pull began after the gate opened, in seconds: what the start's simultaneity is worth. */
export function startSpread(pulls: Array<Pick<WholePull, 'startDelay'>>): number {
  return Math.max(0, ...pulls.map((p) => p.startDelay));
}

/** `bash -c script args…` in the node's namespace, its stdin kept open: `ready` once it printed READY, `ended` when it exits. */
function gatedShell(c: Cluster, node: ClusterHost, script: string, args: string[]) {
  const [cmd, ...pre] = c.nsArgv(node);
  const child = spawn(cmd, [...pre, 'bash', '-c', script, ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString('utf8')));
  const ready = new Promise<void>((resolve, reject) => {
    child.stderr.on('data', (chunk: Buffer) => {
      stderr += chunk.toString('utf8');
      if (stderr.startsWith('READY\n')) resolve();
    });
    child.once('error', (error) => reject(new Error(`${node.name}: cannot start its pull: ${error.message}`)));
    child.once('exit', (code) => reject(new Error(`${node.name}: its pull exited (${code}) before the start gate: ${stderr.trim()}`)));
  });
  ready.catch(() => {}); // awaited by armWholePulls; an exit after the gate is `ended`'s to report
  const ended = new Promise<{ code: number | null; stdout: string; stderr: string; endedAt: number }>((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, stdout, stderr: stderr.replace(/^READY\n/, ''), endedAt: nowSeconds() }));
  });
  ended.catch(() => {}); // a spawn that failed is reported by `ready`; `ended` is awaited only after the gate
  return { node, child, ready, ended };
}
