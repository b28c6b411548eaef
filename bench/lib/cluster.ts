// An emulated cluster on one machine: one Linux network namespace per host, all joined by
// veth pairs to a bridge that lives in its own "hub" namespace, with a tc rate cap on each
// host's NIC in both directions. Nothing is added to the root namespace's links or routes.
//
//   hub ns:   br0 ── h<k> (hub end of host k's veth; egress here = host k's DOWNLOAD, capped)
//   host ns:  eth0 (host end; egress here = host k's UPLOAD, capped), lo
//
// Per DESIGN.md ("The ground we test on"), and what was measured building this:
//  - each veth end gets TSO off and GRO on (GRO on gives a veth its own NAPI receive ring
//    instead of the per-CPU backlog that all namespaces share and that drops packets when
//    many of them receive at once). The hub ends also get gro_max_size 0: they keep the NAPI
//    ring but never merge, because a merged 64 KiB super-packet enters the destination's cap
//    as ONE packet and a full queue drops it whole (seen: 7% of a BitTorrent run's bytes lost
//    that way while tc reported 0.3% of packets dropped). The host ends get GSO off as well,
//    so that what leaves a host's cap is paced frame by frame, not in 64 KiB bursts;
//  - every host's neighbour table holds a permanent entry for every other host and the
//    bridge holds a static FDB entry for every host MAC, so nothing depends on ARP
//    broadcasts or bridge learning;
//  - IPv6 autoconfiguration is off (addrgenmode none) so no router solicitations, MLD or
//    DAD chatter crosses the bridge; bridge netfilter is off in the hub;
//  - this kernel has only the tbf, htb, pfifo and bfifo qdiscs and the u32 classifier (no
//    netem, fq, fq_codel, sfq): there is no added latency, and the default cap ('htb-ack',
//    see Shaper) sends small packets (ACKs) ahead of bulk data so that a host that uploads
//    and downloads at once keeps its full download rate.
//
// Processes are started with `nsenter --net=/run/netns/<ns>`: they join the host's network
// namespace only (not a new mount namespace as `ip netns exec` would make), so mounts made
// by them (FUSE, overlay) are visible to the rest of the machine as usual.
//
// Cleanup: destroy() kills every process still inside the cluster's namespaces (they are
// ours: the namespaces are) and deletes the namespaces, which removes the veths and the
// bridge with them. The same runs synchronously on exit, SIGINT, SIGTERM and SIGHUP.

import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { onExitCleanup, run, spawnService, type RunResult, type Service } from '../../test/fixtures/processes.js';
import { parseBitRate } from '../../src/common/units.js';
import { lowerBound, type LowerBound } from './lower-bound.js';
import { cpuSeconds } from './proc.js';
import { itemAt } from '../../src/common/indexing.js';

// ---------------------------------------------------------------- rates

/** A rate as tc writes it ('25mbit', '400mbit', '1gbit', '500kbit') or a number of bits/s (parseBitRate). */
export type Rate = string | number;

/** Caps of one NIC in bits/s; undefined = not capped in that direction. */
export interface LinkRate {
  up?: number;
  down?: number;
}

type RateSpec = Rate | { up?: Rate; down?: Rate } | null | undefined;

function toLinkRate(spec: RateSpec): LinkRate {
  if (spec === null || spec === undefined) return {};
  if (typeof spec === 'string' || typeof spec === 'number') {
    const r = parseBitRate(spec);
    return { up: r, down: r };
  }
  return {
    up: spec.up === undefined ? undefined : parseBitRate(spec.up),
    down: spec.down === undefined ? undefined : parseBitRate(spec.down),
  };
}

// ---------------------------------------------------------------- lower bound

/** T* for sending F bytes from `source` to `receivers` with the caps the cluster gave them. */
export function clusterLowerBound(F: number, source: ClusterHost, receivers: ClusterHost[]): LowerBound {
  return lowerBound({
    F,
    us: capOf(source, 'up') / 8,
    ui: receivers.map((h) => capOf(h, 'up') / 8),
    dmin: Math.min(...receivers.map((h) => capOf(h, 'down') / 8)),
  });
}

/** A host's cap in bits/s one way: the bounds a benchmark reports need the link capped. */
export function capOf(host: ClusterHost, side: 'up' | 'down'): number {
  const bits = host.rate[side];
  if (bits === undefined) throw new Error(`the bounds need a capped ${side === 'up' ? 'upload' : 'download'} on ${host.name}`);
  return bits;
}

/** A host's entry in a map by host name (allCounters(), allDownloadQdiscStats(), a benchmark's own). */
export function hostEntry<T>(byHost: Map<string, T>, host: string, what: string): T {
  const entry = byHost.get(host);
  if (entry === undefined) throw new Error(`no ${what} for ${host}`);
  return entry;
}

/** The cluster's seed host, for a benchmark that created its cluster with `seed`. */
export function seedOf(c: Cluster): ClusterHost {
  if (!c.seed) throw new Error(`cluster ${c.prefix} has no seed host (createCluster needs seed: true)`);
  return c.seed;
}

// ---------------------------------------------------------------- the cluster

export interface ClusterHost {
  /** 'origin', 'seed', 'n0'… or an extra host's name. */
  name: string;
  role: 'origin' | 'seed' | 'node' | 'extra';
  /** Network namespace name (`ip netns`). */
  ns: string;
  ip: string;
  mac: string;
  /** The host's NIC inside its namespace (always eth0). */
  iface: string;
  /** The other end of its veth, a port of the bridge in the hub namespace. */
  hubPort: string;
  /** Caps in bits/s (tc semantics: 25mbit = 25e6). */
  rate: LinkRate;
}

export interface ClusterOptions {
  nodes: number;
  /** Every node's cap, or one per node; string/number = both directions. Default 25mbit. */
  nodeRate?: RateSpec | RateSpec[];
  /** The origin's (registry's) cap. Default 100mbit. */
  originRate?: RateSpec;
  /** Alias of originRate. */
  registryRate?: RateSpec;
  /** Add a seed host (10.213.0.2); `true` = the node rate, or its own rate. */
  seed?: boolean | { rate?: RateSpec };
  /** More hosts (a tracker, a scheduler…); uncapped unless given a rate. */
  extras?: Array<{ name: string; rate?: RateSpec }>;
  /** Namespace name prefix; default `stl-<pid>-<counter>-`. Must be unique on the machine. */
  prefix?: string;
  /** How caps are built (default htb-ack; env STARLING_SHAPER overrides). */
  shaper?: Shaper;
  /**
   * Depth of each cap's bulk queue in milliseconds of traffic at the cap (default 200; env
   * STARLING_QUEUE_MS overrides). Shallower queues make many-to-one transfers (31 peers
   * into one node) lose more packets; deeper ones add queueing delay to bulk data (small
   * packets skip the queue with 'htb-ack').
   */
  queueMs?: number;
  /**
   * MTU of every link (default 1500; env STARLING_MTU overrides). 9000 (jumbo frames, common in
   * AI clusters' networks) cuts the packets a byte costs six-fold: with GRO unable to merge
   * (see below) every packet is a wake-up for its receiver, and at 32 nodes on two cores the
   * per-packet work of the receiving processes, not the links, can set the pace.
   */
  mtu?: number;
  /** Parallel setup jobs (default 8). */
  concurrency?: number;
}

/** Link counters of a host's NIC. Bytes exclude the 14-byte Ethernet header (52 bytes of headers per TCP packet remain: see tcpPayloadBytes). */
export interface Counters {
  txBytes: number;
  rxBytes: number;
  txPackets: number;
  rxPackets: number;
  /** Dropped on the host's NIC (not counting tc drops, see qdiscStats). */
  txDropped: number;
  rxDropped: number;
}

/** tc's figures for one cap; bytes include the Ethernet header (what the rate is charged on). */
export interface QdiscStats {
  sentBytes: number;
  sentPackets: number;
  drops: number;
  overlimits: number;
  requeues: number;
}

export interface ExecOptions {
  env?: Record<string, string | undefined>;
  cwd?: string;
  input?: string | Buffer;
  timeoutMs?: number;
  /** Return the result instead of throwing on a non-zero exit. */
  allowFail?: boolean;
}

export interface SpawnOptions {
  env?: Record<string, string | undefined>;
  cwd?: string;
  logFile?: string;
  name?: string;
}

export interface Cluster {
  prefix: string;
  hubNs: string;
  bridge: string;
  /** Addresses are 10.213.0.0/16 inside each cluster (clusters are isolated from each other). */
  subnet: string;
  origin: ClusterHost;
  seed?: ClusterHost;
  nodes: ClusterHost[];
  extras: Record<string, ClusterHost>;
  /** origin, seed, extras, nodes. */
  hosts: ClusterHost[];
  host(name: string): ClusterHost;
  /** Run a command to completion inside the host's network namespace; throws on non-zero exit unless allowFail. */
  exec(host: ClusterHost | string, cmd: string, args?: string[], opts?: ExecOptions): Promise<RunResult>;
  /** Start a long-running process inside the host's network namespace (stopped by destroy() at the latest). */
  spawn(host: ClusterHost | string, cmd: string, args?: string[], opts?: SpawnOptions): Promise<Service>;
  /** The argv prefix that runs a command in the host's network namespace (for your own spawn). */
  nsArgv(host: ClusterHost | string): [string, ...string[]];
  /** Byte/packet counters of the host's eth0 (tx = what it sent: its egress). */
  counters(host: ClusterHost | string): Promise<Counters>;
  /** Counters of every host at once, read from the hub side in one call (tx/rx seen from the host). */
  allCounters(): Promise<Map<string, Counters>>;
  /** Pids of the processes now inside the cluster's namespaces (from /proc, no spawn). */
  pids(): number[];
  /** user+system CPU seconds used so far by the processes now inside the cluster's namespaces. */
  cpuSeconds(): number;
  /** tc statistics of every host's download cap (its hub port's egress), in one call. */
  allDownloadQdiscStats(): Promise<Map<string, QdiscStats>>;
  /** tc statistics of the host's caps: up = its eth0 egress, down = its hub port's egress. */
  qdiscStats(host: ClusterHost | string): Promise<{ up?: QdiscStats; down?: QdiscStats }>;
  /** Changes a host's caps now (a link that slows down mid-run); a direction left out keeps its cap. */
  setRate(host: ClusterHost | string, rate: LinkRate): Promise<void>;
  destroy(): Promise<void>;
}

let clusterCounter = 0;

const SUBNET = '10.213.0.0/16';

function hostAddress(role: ClusterHost['role'], index: number): [number, number] {
  if (role === 'origin') return [0, 1];
  if (role === 'seed') return [0, 2];
  if (role === 'extra') {
    if (index > 200) throw new Error('too many extra hosts');
    return [0, 10 + index];
  }
  const third = 1 + Math.floor(index / 250);
  if (third > 254) throw new Error('too many nodes');
  return [third, 1 + (index % 250)];
}

const hex = (n: number) => n.toString(16).padStart(2, '0');

/**
 * How each cap is built (only tbf, htb, pfifo, bfifo and the u32 classifier exist in this kernel):
 *  - 'tbf': a token bucket with one FIFO;
 *  - 'htb-ack': an htb class at the rate with two leaves: small packets (pure ACKs, SYNs,
 *    control messages: IP length < 128) first, bulk data in a FIFO. Without it, a host that
 *    uploads and downloads at once (every P2P peer) queues the ACKs of its download behind
 *    its own upload and loses 5–10% of its download rate (measured: ring 0.92–0.94 of the
 *    ideal with tbf, 0.99–1.00 with htb-ack); real hosts avoid that with fq/fq_codel,
 *    which this kernel lacks.
 */
export type Shaper = 'tbf' | 'htb-ack';

/** tc batch lines that cap `dev`'s egress at `bitsPerSecond` with a bulk queue of `queueMs`. */
function shaperLines(dev: string, bitsPerSecond: number, shaper: Shaper, queueMs: number): string[] {
  if (shaper === 'tbf') return shaperRateLines(dev, bitsPerSecond, shaper, queueMs).map((l) => l.replace(/^qdisc change/, 'qdisc replace'));
  return [
    `qdisc replace dev ${dev} root handle 1: htb default 20`,
    ...shaperRateLines(dev, bitsPerSecond, shaper, queueMs),
    `qdisc replace dev ${dev} parent 1:10 handle 10: pfifo limit 10000`,
    // IPv4 total length (bytes 2–3 of the IP header) < 128.
    `filter replace dev ${dev} parent 1: protocol ip prio 1 u32 match u16 0x0000 0xff80 at 2 flowid 1:10`,
  ];
}

/**
 * The lines of shaperLines that set the rate, which also change an existing cap in place: a
 * second `qdisc replace` of the htb root is refused ("Change operation not supported") and a
 * second `filter replace` adds a duplicate filter.
 */
function shaperRateLines(dev: string, bitsPerSecond: number, shaper: Shaper, queueMs: number): string[] {
  const Bps = bitsPerSecond / 8;
  const rate = `${Math.round(bitsPerSecond)}bit`;
  // burst: ≥ a few MTUs and ~4 ms of traffic; FIFO queue: queueMs of traffic (at least
  // 64 KiB over the burst).
  const burst = Math.max(32 * 1024, Math.round(Bps * 0.004));
  const limit = Math.max(burst + 64 * 1024, Math.round((Bps * queueMs) / 1000));
  if (shaper === 'tbf') return [`qdisc change dev ${dev} root handle 1: tbf rate ${rate} burst ${burst} limit ${limit}`];
  const small = `${Math.max(8000, Math.round(bitsPerSecond / 20))}bit`;
  return [
    `class replace dev ${dev} parent 1: classid 1:1 htb rate ${rate} ceil ${rate} burst ${burst} cburst ${burst}`,
    `class replace dev ${dev} parent 1:1 classid 1:10 htb rate ${small} ceil ${rate} burst ${burst} cburst ${burst} prio 0 quantum 1514`,
    `class replace dev ${dev} parent 1:1 classid 1:20 htb rate ${rate} ceil ${rate} burst ${burst} cburst ${burst} prio 1 quantum 1514`,
    `qdisc replace dev ${dev} parent 1:20 handle 20: bfifo limit ${limit}`,
  ];
}

async function must(cmd: string, args: string[], input?: string): Promise<RunResult> {
  const res = await run(cmd, args, { input, timeoutMs: 120_000 });
  if (res.code !== 0) {
    const shown = input && input.length < 2000 ? `\ninput:\n${input}` : '';
    throw new Error(`${cmd} ${args.join(' ')} failed (exit ${res.code ?? res.signal}): ${res.stderr.trim() || res.stdout.trim()}${shown}`);
  }
  return res;
}

async function pool<T>(items: T[], concurrency: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  const workers = Array.from({ length: Math.min(concurrency, items.length) }, async () => {
    while (next < items.length) await fn(itemAt(items, next++));
  });
  await Promise.all(workers);
}

/** Namespaces currently on the machine whose name starts with `prefix`. */
export function listNamespaces(prefix: string): string[] {
  let names: string[] = [];
  try {
    names = fs.readdirSync('/run/netns');
  } catch {
    return [];
  }
  return names.filter((n) => n.startsWith(prefix));
}

function pidsInNsSync(ns: string): number[] {
  try {
    const out = execFileSync('ip', ['netns', 'pids', ns], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
    return out
      .split(/\s+/)
      .filter(Boolean)
      .map(Number)
      .filter((p) => p !== process.pid);
  } catch {
    return [];
  }
}

function killAll(pids: number[], sig: NodeJS.Signals): void {
  for (const pid of pids) {
    try {
      process.kill(pid, sig);
    } catch {
      // gone
    }
  }
}

/** Kill what runs in the namespaces and delete them, synchronously (exit path). */
function teardownSync(namespaces: string[]): void {
  const existing = new Set(listNamespaces(''));
  const ours = namespaces.filter((ns) => existing.has(ns));
  for (const ns of ours) killAll(pidsInNsSync(ns), 'SIGKILL');
  if (ours.length === 0) return;
  try {
    execFileSync('ip', ['-force', '-batch', '-'], {
      input: ours.map((ns) => `netns del ${ns}\n`).join(''),
      stdio: ['pipe', 'ignore', 'ignore'],
    });
  } catch {
    // best effort on the exit path
  }
}

export async function createCluster(opts: ClusterOptions): Promise<Cluster> {
  const N = opts.nodes;
  if (!Number.isInteger(N) || N < 1) throw new Error(`nodes must be a positive integer, got ${N}`);
  const prefix = opts.prefix ?? `stl-${process.pid}-${clusterCounter++}-`;
  if (!/^[A-Za-z0-9_.-]+$/.test(prefix)) throw new Error(`bad namespace prefix "${prefix}"`);
  if (listNamespaces(prefix).length) throw new Error(`namespaces named ${prefix}* already exist`);
  const hubNs = `${prefix}hub`;
  const bridge = 'br0';

  const hosts: ClusterHost[] = [];
  const mk = (name: string, role: ClusterHost['role'], index: number, rate: LinkRate): ClusterHost => {
    const [a, b] = hostAddress(role, index);
    const k = hosts.length;
    const h: ClusterHost = {
      name,
      role,
      ns: `${prefix}${name}`,
      ip: `10.213.${a}.${b}`,
      mac: `02:13:00:00:${hex(a)}:${hex(b)}`,
      iface: 'eth0',
      hubPort: `h${k}`,
      // A copy: setRate changes one host's caps, and nodes may share one spec.
      rate: { ...rate },
    };
    hosts.push(h);
    return h;
  };
  const origin = mk('origin', 'origin', 0, toLinkRate(opts.originRate ?? opts.registryRate ?? '100mbit'));
  const nodeRates = Array.isArray(opts.nodeRate) ? opts.nodeRate : undefined;
  if (nodeRates && nodeRates.length !== N) throw new Error(`nodeRate has ${nodeRates.length} entries for ${N} nodes`);
  const defaultNodeRate = toLinkRate(nodeRates ? undefined : ((opts.nodeRate as RateSpec) ?? '25mbit'));
  let seed: ClusterHost | undefined;
  if (opts.seed) {
    const r = typeof opts.seed === 'object' && opts.seed.rate !== undefined ? toLinkRate(opts.seed.rate) : defaultNodeRate;
    seed = mk('seed', 'seed', 0, r);
  }
  const extras: Record<string, ClusterHost> = {};
  (opts.extras ?? []).forEach((e, j) => {
    if (!/^[a-z][a-z0-9-]{0,30}$/.test(e.name) || /^n\d+$/.test(e.name) || ['origin', 'seed', 'hub'].includes(e.name) || extras[e.name]) {
      throw new Error(`bad or duplicate extra host name "${e.name}"`);
    }
    extras[e.name] = mk(e.name, 'extra', j, toLinkRate(e.rate));
  });
  const nodes: ClusterHost[] = [];
  for (let i = 0; i < N; i++) nodes.push(mk(`n${i}`, 'node', i, nodeRates ? toLinkRate(nodeRates[i]) : defaultNodeRate));

  const namespaces = [hubNs, ...hosts.map((h) => h.ns)];
  const services = new Set<Service>();
  let destroyed = false;
  const unregister = onExitCleanup(() => {
    for (const s of services) {
      try {
        process.kill(-s.pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    teardownSync(namespaces);
  });

  const caps = {
    shaper: opts.shaper ?? (process.env.STARLING_SHAPER as Shaper | undefined) ?? 'htb-ack',
    queueMs: opts.queueMs ?? Number(process.env.STARLING_QUEUE_MS ?? 200),
    mtu: opts.mtu ?? Number(process.env.STARLING_MTU ?? 1500),
  };
  const byName = new Map(hosts.map((h) => [h.name, h]));
  const resolve = (h: ClusterHost | string): ClusterHost => {
    if (typeof h !== 'string') return h;
    const found = byName.get(h);
    if (!found) throw new Error(`no host "${h}" in cluster ${prefix}`);
    return found;
  };
  const nsArgv = (h: ClusterHost | string): [string, ...string[]] => ['nsenter', `--net=/run/netns/${resolve(h).ns}`, '--'];

  const cluster: Cluster = {
    prefix,
    hubNs,
    bridge,
    subnet: SUBNET,
    origin,
    seed,
    nodes,
    extras,
    hosts,
    host: resolve,
    nsArgv,
    async exec(h, cmd, args = [], o = {}) {
      const [c, ...pre] = nsArgv(h);
      const res = await run(c, [...pre, cmd, ...args], { env: o.env, cwd: o.cwd, input: o.input, timeoutMs: o.timeoutMs ?? 120_000 });
      if (res.code !== 0 && !o.allowFail) {
        throw new Error(
          `[${resolve(h).name}] ${cmd} ${args.join(' ')} failed (exit ${res.code ?? res.signal}): ${res.stderr.trim() || res.stdout.trim()}`,
        );
      }
      return res;
    },
    async spawn(h, cmd, args = [], o = {}) {
      const host = resolve(h);
      const [c, ...pre] = nsArgv(host);
      const svc = await spawnService({
        cmd: c,
        args: [...pre, cmd, ...args],
        env: o.env,
        cwd: o.cwd,
        logFile: o.logFile,
        name: o.name ?? `${host.name}-${cmd.split('/').pop()}`,
      });
      services.add(svc);
      void svc.exited.then(() => services.delete(svc));
      return svc;
    },
    async counters(h) {
      const host = resolve(h);
      const res = await must('ip', ['-n', host.ns, '-s', '-j', 'link', 'show', 'dev', host.iface]);
      const [link] = JSON.parse(res.stdout) as LinkJson[]; // `ip -j link show dev X`: one link
      if (!link) throw new Error(`ip -j link show dev ${host.iface} in ${host.ns} listed no link`);
      return countersOf(link);
    },
    async allCounters() {
      const res = await must('ip', ['-n', hubNs, '-s', '-j', 'link', 'show']);
      const byPort = new Map<string, Counters>();
      for (const link of JSON.parse(res.stdout) as LinkJson[]) byPort.set(link.ifname, countersOf(link));
      const out = new Map<string, Counters>();
      for (const host of hosts) {
        const c = byPort.get(host.hubPort);
        if (!c) continue;
        // The hub port sees the mirror image: what it transmits, the host received.
        out.set(host.name, {
          txBytes: c.rxBytes,
          rxBytes: c.txBytes,
          txPackets: c.rxPackets,
          rxPackets: c.txPackets,
          txDropped: c.rxDropped,
          rxDropped: c.txDropped,
        });
      }
      return out;
    },
    pids() {
      const inodes = new Set<number>();
      for (const ns of namespaces) {
        try {
          inodes.add(fs.statSync(`/run/netns/${ns}`).ino);
        } catch {
          // not created yet or gone
        }
      }
      const out: number[] = [];
      for (const entry of fs.readdirSync('/proc')) {
        if (!/^\d+$/.test(entry)) continue;
        try {
          const m = /^net:\[(\d+)\]$/.exec(fs.readlinkSync(`/proc/${entry}/ns/net`));
          if (m && inodes.has(Number(m[1]))) out.push(Number(entry));
        } catch {
          // gone, or a kernel thread
        }
      }
      return out;
    },
    cpuSeconds() {
      return cluster.pids().reduce((sum, pid) => sum + cpuSeconds(pid), 0);
    },
    async allDownloadQdiscStats() {
      const res = await must('tc', ['-n', hubNs, '-s', '-j', 'qdisc', 'show']);
      const byDev = new Map<string, QdiscStats>();
      for (const q of JSON.parse(res.stdout) as Array<QdiscJson & { dev: string }>) {
        if (q.root) byDev.set(q.dev, qdiscStatsOf(q));
      }
      const out = new Map<string, QdiscStats>();
      for (const host of hosts) {
        const q = byDev.get(host.hubPort);
        if (q) out.set(host.name, q);
      }
      return out;
    },
    async qdiscStats(h) {
      const host = resolve(h);
      const read = async (ns: string, dev: string) => {
        const res = await must('tc', ['-n', ns, '-s', '-j', 'qdisc', 'show', 'dev', dev]);
        const q = (JSON.parse(res.stdout) as QdiscJson[]).find((x) => x.root);
        return q ? qdiscStatsOf(q) : undefined;
      };
      return { up: await read(host.ns, host.iface), down: await read(hubNs, host.hubPort) };
    },
    async setRate(h, rate) {
      const host = resolve(h);
      // The classes' rates and the queue's depth change in place.
      if (rate.up !== undefined) {
        if (host.rate.up === undefined) throw new Error(`${host.name} has no upload cap to change`);
        await must(
          'tc',
          ['-n', host.ns, '-batch', '-'],
          shaperRateLines(host.iface, rate.up, caps.shaper, caps.queueMs)
            .map((l) => l + '\n')
            .join(''),
        );
        host.rate.up = rate.up;
      }
      if (rate.down !== undefined) {
        if (host.rate.down === undefined) throw new Error(`${host.name} has no download cap to change`);
        await must(
          'tc',
          ['-n', hubNs, '-batch', '-'],
          shaperRateLines(host.hubPort, rate.down, caps.shaper, caps.queueMs)
            .map((l) => l + '\n')
            .join(''),
        );
        host.rate.down = rate.down;
      }
    },
    async destroy() {
      if (destroyed) return;
      destroyed = true;
      await Promise.all([...services].map((s) => s.stop(3000)));
      // Anything else still inside our namespaces (a helper that double-forked, an exec'd
      // command that outlived its timeout) is ours too.
      const live = namespaces.filter((ns) => listNamespaces(prefix).includes(ns));
      let pids = live.flatMap(pidsInNsSync);
      if (pids.length) {
        killAll(pids, 'SIGTERM');
        for (let i = 0; i < 20 && pids.length; i++) {
          await sleep(100);
          pids = live.flatMap(pidsInNsSync);
        }
        killAll(pids, 'SIGKILL');
      }
      if (live.length) await must('ip', ['-force', '-batch', '-'], live.map((ns) => `netns del ${ns}\n`).join(''));
      unregister();
      const left = listNamespaces(prefix);
      if (left.length) throw new Error(`namespaces left after destroy: ${left.join(' ')}`);
    },
  };

  try {
    await setup(cluster, opts.concurrency ?? 8, caps);
  } catch (err) {
    await cluster.destroy().catch(() => teardownSync(namespaces));
    throw err;
  }
  return cluster;
}

interface LinkJson {
  ifname: string;
  stats64: {
    rx: { bytes: number; packets: number; dropped: number };
    tx: { bytes: number; packets: number; dropped: number };
  };
}

interface QdiscJson {
  kind: string;
  root?: boolean;
  bytes: number;
  packets: number;
  drops: number;
  overlimits: number;
  requeues: number;
}

function qdiscStatsOf(q: QdiscJson): QdiscStats {
  return { sentBytes: q.bytes, sentPackets: q.packets, drops: q.drops, overlimits: q.overlimits, requeues: q.requeues };
}

function countersOf(link: LinkJson): Counters {
  return {
    txBytes: link.stats64.tx.bytes,
    rxBytes: link.stats64.rx.bytes,
    txPackets: link.stats64.tx.packets,
    rxPackets: link.stats64.rx.packets,
    txDropped: link.stats64.tx.dropped,
    rxDropped: link.stats64.rx.dropped,
  };
}

async function setup(
  c: Cluster,
  concurrency: number,
  { shaper, queueMs, mtu }: { shaper: Shaper; queueMs: number; mtu: number },
): Promise<void> {
  if (shaper !== 'tbf' && shaper !== 'htb-ack') throw new Error(`unknown shaper "${String(shaper)}" (tbf, htb-ack)`);
  if (!(queueMs > 0)) throw new Error(`queueMs must be positive, got ${queueMs}`);
  if (!Number.isInteger(mtu) || mtu < 576 || mtu > 9000) throw new Error(`mtu must be an integer from 576 to 9000, got ${mtu}`);
  const hosts = c.hosts;
  // 1. Namespaces, in one call.
  await must('ip', ['-batch', '-'], [c.hubNs, ...hosts.map((h) => h.ns)].map((ns) => `netns add ${ns}\n`).join(''));

  // 2. The hub: bridge, veth pairs (created here, host end moved straight into its
  //    namespace: never visible in the root namespace), ports up.
  const hub: string[] = [
    'link set lo up',
    `link add ${c.bridge} type bridge forward_delay 0 stp_state 0 mcast_snooping 0`,
    `link set ${c.bridge} addrgenmode none`,
    `link set ${c.bridge} up`,
  ];
  for (const h of hosts) {
    const hubMac = h.mac.replace(/^02:13:00/, '02:13:01');
    hub.push(`link add ${h.hubPort} address ${hubMac} type veth peer name ${h.iface} address ${h.mac} netns ${h.ns}`);
    hub.push(`link set ${h.hubPort} addrgenmode none`);
    hub.push(`link set ${h.hubPort} mtu ${mtu}`);
    // GRO stays on (its NAPI ring keeps the shared per-CPU backlog out of the path) but may
    // not merge: a merged 64 KiB super-packet would enter the destination's cap as one
    // packet and a full queue would drop it whole (tens of segments at once).
    hub.push(`link set ${h.hubPort} gro_max_size 0`);
    hub.push(`link set ${h.hubPort} master ${c.bridge}`);
    hub.push(`link set ${h.hubPort} up`);
  }
  await must('ip', ['-n', c.hubNs, '-batch', '-'], hub.map((l) => l + '\n').join(''));
  // Bridge netfilter would send every bridged frame through the hub's (empty) iptables hooks.
  await must('nsenter', [
    `--net=/run/netns/${c.hubNs}`,
    '--',
    'sh',
    '-c',
    'for f in /proc/sys/net/bridge/bridge-nf-call-iptables /proc/sys/net/bridge/bridge-nf-call-ip6tables /proc/sys/net/bridge/bridge-nf-call-arptables; do [ -w "$f" ] && echo 0 > "$f"; done; true',
  ]);
  // Static FDB entries: the bridge never has to flood or learn.
  await must('bridge', ['-n', c.hubNs, '-batch', '-'], hosts.map((h) => `fdb replace ${h.mac} dev ${h.hubPort} master static\n`).join(''));
  // Hub-side caps (= each host's download) and offloads.
  const hubTc = hosts.flatMap((h) => (h.rate.down === undefined ? [] : shaperLines(h.hubPort, h.rate.down, shaper, queueMs)));
  if (hubTc.length) await must('tc', ['-n', c.hubNs, '-batch', '-'], hubTc.map((l) => l + '\n').join(''));
  const ports = hosts.map((h) => h.hubPort).join(' ');
  await must('nsenter', [
    `--net=/run/netns/${c.hubNs}`,
    '--',
    'sh',
    '-c',
    `for p in ${ports}; do ethtool -K "$p" tso off gro on || exit 1; done`,
  ]);

  // 3. Each host: loopback, address, link up, permanent neighbours, upload cap, offloads.
  const neigh = hosts.map((h) => ({ ip: h.ip, mac: h.mac }));
  const prefixLen = SUBNET.split('/')[1];
  await pool(hosts, concurrency, async (h) => {
    const lines = [
      'link set lo up',
      `link set ${h.iface} addrgenmode none`,
      `link set ${h.iface} mtu ${mtu}`,
      `addr add ${h.ip}/${prefixLen} dev ${h.iface}`,
      `link set ${h.iface} up`,
    ];
    for (const n of neigh) if (n.ip !== h.ip) lines.push(`neigh replace ${n.ip} lladdr ${n.mac} dev ${h.iface} nud permanent`);
    await must('ip', ['-n', h.ns, '-batch', '-'], lines.map((l) => l + '\n').join(''));
    if (h.rate.up !== undefined)
      await must(
        'tc',
        ['-n', h.ns, '-batch', '-'],
        shaperLines(h.iface, h.rate.up, shaper, queueMs)
          .map((l) => l + '\n')
          .join(''),
      );
    // GSO off too: a 64 KiB GSO packet leaves the host's cap as one unit and then crosses
    // the bridge as a line-rate burst of 44 frames; with it on, 31 senders into one node
    // lost a quarter of their packets at its cap and got 0.65 of its rate instead of 0.97.
    await must('nsenter', [`--net=/run/netns/${h.ns}`, '--', 'ethtool', '-K', h.iface, 'tso', 'off', 'gso', 'off', 'gro', 'on']);
  });
}

// ---------------------------------------------------------------- CPU use

export interface CpuReport {
  seconds: number;
  samples: number;
  cpus: number;
  /** Busy share of the whole machine (all cores), mean over the run, 0–100. */
  meanBusyPct: number;
  /** Highest busy share of the whole machine in one sampling interval. */
  maxBusyPct: number;
  /** Mean busy share of each core. */
  perCpuMeanPct: number[];
  /**
   * CPU used by this benchmark's own processes (this process, its reaped children, and
   * what `ownCpuSeconds` counts), as a share of the whole machine, 0–100. Kernel network
   * work done in softirq context is mostly not charged to any process: see softirqPct.
   */
  ownPct: number;
  /** Of the whole machine's time: user, system, softirq (network stack work), iowait. */
  userPct: number;
  systemPct: number;
  softirqPct: number;
  iowaitPct: number;
}

interface CpuTimes {
  total: number;
  idle: number; // idle + iowait
  user: number; // user + nice
  system: number;
  softirq: number;
  iowait: number;
}

function readProcStat(): CpuTimes[] {
  // Line "cpu" (all) first, then "cpu0", "cpu1"…; fields: user nice system idle iowait irq softirq steal…
  const lines = fs
    .readFileSync('/proc/stat', 'utf8')
    .split('\n')
    .filter((l) => /^cpu\d* /.test(l));
  return lines.map((l) => {
    const f = l.trim().split(/\s+/).slice(1).map(Number);
    const [user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0] = f;
    return {
      total: user + nice + system + idle + iowait + irq + softirq + steal,
      idle: idle + iowait,
      user: user + nice,
      system: system + irq,
      softirq,
      iowait,
    };
  });
}

/** CPU seconds of this process plus its children that have exited and been waited for. */
export function selfAndReapedChildrenCpuSeconds(): number {
  const stat = fs.readFileSync('/proc/self/stat', 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // utime stime cutime cstime are fields 14–17 (index 11–14 after the command name).
  return (Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) / 100;
}

/**
 * Samples /proc/stat every `intervalMs` until stop(): machine-wide CPU use of a benchmark
 * run. `ownCpuSeconds` (e.g. `() => cluster.cpuSeconds()`) adds live processes that this
 * process started, so that ownPct can be told apart from other load on the machine.
 */
export function startCpuSampler(intervalMs = 500, ownCpuSeconds: () => number = () => 0): { stop(): CpuReport } {
  const t0 = Date.now();
  const own0 = selfAndReapedChildrenCpuSeconds() + ownCpuSeconds();
  const first = readProcStat();
  let prev = first;
  let maxBusy = 0;
  let samples = 0;
  const timer = setInterval(() => {
    const now = readProcStat();
    const [all, allBefore] = [itemAt(now, 0), itemAt(prev, 0)];
    const dt = all.total - allBefore.total;
    if (dt > 0) maxBusy = Math.max(maxBusy, (100 * (dt - (all.idle - allBefore.idle))) / dt);
    prev = now;
    samples++;
  }, intervalMs);
  timer.unref();
  return {
    stop() {
      clearInterval(timer);
      const last = readProcStat();
      const own = selfAndReapedChildrenCpuSeconds() + ownCpuSeconds() - own0;
      const d = (i: number, k: keyof CpuTimes) => itemAt(last, i)[k] - itemAt(first, i)[k];
      const total = d(0, 'total') || 1;
      const pct = (k: keyof CpuTimes) => (100 * d(0, k)) / total;
      const perCpu = last.slice(1).map((_, j) => {
        const t = d(j + 1, 'total') || 1;
        return (100 * (t - d(j + 1, 'idle'))) / t;
      });
      const meanBusy = 100 - pct('idle');
      return {
        seconds: (Date.now() - t0) / 1000,
        samples,
        cpus: perCpu.length,
        meanBusyPct: meanBusy,
        maxBusyPct: Math.max(maxBusy, meanBusy),
        perCpuMeanPct: perCpu,
        ownPct: (100 * own) / (((Date.now() - t0) / 1000) * Math.max(1, perCpu.length)),
        userPct: pct('user'),
        systemPct: pct('system'),
        softirqPct: pct('softirq'),
        iowaitPct: pct('iowait'),
      };
    },
  };
}

// ---------------------------------------------------------------- small helpers for reports

/** Spawn-free wall clock in seconds with sub-ms resolution. */
export function nowSeconds(): number {
  return Number(process.hrtime.bigint()) / 1e9;
}

/**
 * Estimated TCP payload in a link byte counter: a veth counts each packet without its
 * 14-byte Ethernet header, so every packet carries 52 bytes of IPv4 + TCP-with-timestamps
 * headers (pure ACKs carry only those). Good to a fraction of a percent for bulk TCP
 * transfers. (tc's qdisc counters include the Ethernet header: 66 bytes a packet.)
 */
export function tcpPayloadBytes(bytes: number, packets: number): number {
  return Math.max(0, bytes - 52 * packets);
}

/**
 * Packets the kernel dropped because a CPU's shared receive backlog was full
 * (/proc/net/softnet_stat, second column, summed over CPUs). Machine-wide: take the
 * difference over a run; it should stay 0 (the veths' own NAPI rings keep traffic off it).
 */
export function softnetDrops(): number {
  try {
    return fs
      .readFileSync('/proc/net/softnet_stat', 'utf8')
      .trim()
      .split('\n')
      .reduce((sum, line) => sum + parseInt(line.trim().split(/\s+/)[1] ?? '0', 16), 0);
  } catch {
    return 0;
  }
}
