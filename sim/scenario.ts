// A simulated cluster (registry, scheduler, seed peers, nodes in racks in zones) and the three
// ways it can get an image to every node: (a) direct pulls from the registry, (b) the Starling
// swarm with full downloads, (c) the Starling swarm with a lazy (eStargz) start.

import { lowerBound, type LowerBound } from '../bench/lib/lower-bound.js';
import type { NodeLink } from '../bench/lib/link-plan.js';
import { boundRatios, nodeBounds, type BoundRatios } from '../bench/lib/node-bounds.js';
import { silentLogger } from '../src/common/log.js';
import type { HostInfo } from '../src/rpc/scheduler-api.js';
import { defaultScheduling, type SchedulingConfig } from '../src/scheduler/config.js';
import { pino } from 'pino';
import { Resources } from '../src/scheduler/resources.js';
import { Scheduling } from '../src/scheduler/scheduling.js';
import { pieceSizeFor } from '../src/storage/piece-plan.js';
import { seededRandom } from '../bench/lib/random.js';
import { EventQueue } from './event-queue.js';
import { Network, runUntil, type Latency, type Link, type LoadSample, type NetHost } from './network.js';
import { DEFAULT_UPLOAD_SLOTS, defaultPeerSettings, World, type PeerSettings, type SimDownload, type SimTask } from './peer.js';
import { itemAt } from '../src/common/indexing.js';
import { median } from '../bench/lib/stats.js';

export type ScenarioName = 'direct' | 'p2p' | 'lazy';

/** TCP payload per frame on a tc-shaped 1500-byte-MTU link (tc counts 1514-byte frames). */
export const EFFICIENCY_TC = 1448 / 1514;
/** ... on a real Ethernet link (preamble, FCS and inter-frame gap: 1538 bytes on the wire). */
export const EFFICIENCY_ETHERNET = 1448 / 1538;

export interface Setup {
  nodes: number;
  /** Blob size in bytes. */
  size: number;
  /** Default: what the real peer picks (src/storage/piece-plan.ts pieceSizeFor). */
  pieceSize?: number;
  /** Node NIC, bits/s. */
  nodeUp: number;
  nodeDown: number;
  /**
   * One link per node, over time (bench/lib/link-plan.ts: the emulated cluster's --node-rate and
   * --rate-change); when given, it replaces nodeUp and nodeDown.
   */
  links?: NodeLink[];
  seedUp: number;
  seedDown: number;
  seeds: number;
  registryUp: number;
  registryDown?: number;
  /** Nodes per rack. */
  rackSize: number;
  zones: number;
  /** Capacity of each rack's link to the rest of its zone (bits/s, each way); undefined: not a bottleneck. */
  rackUplink?: number;
  /** Capacity of each zone's link to the other zones (bits/s, each way). */
  zoneUplink?: number;
  latency: Latency;
  efficiency: number;
  quantum: number;
  scheduling: SchedulingConfig;
  /** The scheduler's periodic pass (scheduler config tickMs), seconds. */
  tick: number;
  peer: PeerSettings;
  uploadSlots: { node: number; seed: number };
  rngSeed: number;
  /** Nodes start at a uniformly random moment in [0, startSpread] seconds. */
  startSpread: number;
  /** Unequal TCP shares: see NetworkOptions.noise (0: exact max-min fairness). */
  noise: number;
  /** The scheduler's log level (JSON lines on stderr, `t` in simulated seconds); silent when unset. */
  schedulerLog?: string;
}

export interface LazyOptions {
  /** Share of the blob the workload reads before it is ready (a prefetched prefix). */
  fraction: number;
  /** Footer + TOC at the end of the blob, read first. */
  tocBytes: number;
  /** Fetch the rest after the start (the snapshotter's background fetch). */
  background: boolean;
}

export const defaultLazy = (): LazyOptions => ({ fraction: 0.062, tocBytes: 4 * 2 ** 20, background: false });

export function defaultSetup(overrides: Partial<Setup> = {}): Setup {
  const base: Setup = {
    nodes: 8,
    size: 64 * 2 ** 20,
    nodeUp: 20e6,
    nodeDown: 20e6,
    seedUp: 80e6,
    seedDown: 80e6,
    seeds: 1,
    registryUp: 80e6,
    rackSize: 32,
    zones: 1,
    latency: { sameRack: 50e-6, crossRack: 150e-6, crossZone: 1e-3 },
    efficiency: EFFICIENCY_TC,
    quantum: 0,
    scheduling: defaultScheduling(),
    tick: 2,
    peer: defaultPeerSettings(),
    uploadSlots: { ...DEFAULT_UPLOAD_SLOTS },
    rngSeed: 1,
    startSpread: 0,
    noise: 0,
  };
  return { ...base, ...overrides };
}

export interface RunResult {
  scenario: ScenarioName;
  nodes: number;
  size: number;
  pieceSize: number;
  pieceCount: number;
  /** Per node: seconds from the common start until it could run the container. */
  ready: number[];
  first: number;
  median: number;
  last: number;
  /** Bytes each node had to receive before it was ready (the basis of T*). */
  neededBytes: number;
  lowerBound: LowerBound;
  ratio: number;
  /** Each node's own bound b_i (bench/lib/node-bounds.ts), seconds, and its group of equal links. */
  bounds: number[];
  groups: string[];
  /** Median and worst of ready_i / b_i, overall and per group. */
  ownBound: BoundRatios;
  /** Registry egress until the last node was ready, and in all (the seed may read on). */
  registryBytes: number;
  registryBytesTotal: number;
  registryPeakBps: number;
  registrySamples: LoadSample[];
  /** Mean bytes stored per node when it became ready, and at the end of the run. */
  writtenAtReady: number;
  writtenAtEnd: number;
  /** Bytes the nodes got from the seeds, from other nodes, from the origin (copies of the blob). */
  copiesFromSeeds: number;
  copiesFromNodes: number;
  copiesFromOrigin: number;
  /** Bytes the seeds uploaded, in copies. */
  seedUploadCopies: number;
  /** Share of their upload capacity the seeds and the nodes used until the last node was ready. */
  seedUploadUse: number;
  nodeUploadUse: number;
  schedulerMs: number;
  schedulerCalls: number;
  /** Wall-clock milliseconds of each of the scheduler's periodic passes (tick()). */
  tickMs: number[];
  cyclesDetected: number;
  events: number;
  recomputations: number;
  busyAnswers: number;
  duplicateBytes: number;
  /** Bytes of piece transfers aborted part-way (endgame losers, relays cut short). */
  abortedBytes: number;
  simulatedSeconds: number;
  wallMs: number;
}

const TASK_ID = `sha256:${'5a'.repeat(32)}`;

/** Every node's link: `setup.links`, or nodeUp / nodeDown for all. */
export function nodeLinksOf(setup: Setup): NodeLink[] {
  if (setup.links) {
    if (setup.links.length !== setup.nodes) throw new Error(`${setup.links.length} node links for ${setup.nodes} nodes`);
    return setup.links;
  }
  return Array.from({ length: setup.nodes }, () => ({ group: 'all', steps: [{ at: 0, down: setup.nodeDown, up: setup.nodeUp }] }));
}

/** `progress` (optional) hears a line about every 30 s of wall time on long runs. */
export function run(scenario: ScenarioName, setup: Setup, lazy: LazyOptions = defaultLazy(), progress?: (line: string) => void): RunResult {
  const wallStart = performance.now();
  const random = seededRandom(setup.rngSeed);
  const queue = new EventQueue();
  const net = new Network(queue, {
    efficiency: setup.efficiency,
    quantum: setup.quantum,
    latency: setup.latency,
    noise: setup.noise,
    random: seededRandom(setup.rngSeed * 7919 + 17),
  });
  const pieceSize = setup.pieceSize ?? pieceSizeFor(setup.size);
  const task: SimTask = {
    id: TASK_ID,
    size: setup.size,
    pieceSize,
    pieceCount: Math.max(1, Math.ceil(setup.size / pieceSize)),
    originUrl: 'http://registry.sim/v2/image/blobs/' + TASK_ID,
  };

  // ---- topology: zones z0…, racks of `rackSize` nodes dealt to the zones in turn; each zone
  // has an infrastructure rack for its seeds; the registry and the scheduler sit in z0's.
  const zones = Array.from({ length: setup.zones }, (_, z) => net.zone(`z${z}`, setup.zoneUplink));
  const infra = zones.map((zone) => net.rack(`${zone.name}-infra`, zone, setup.rackUplink));
  const registry = net.host('registry', itemAt(infra, 0), setup.registryUp, setup.registryDown);
  const schedulerHost = net.host('scheduler', itemAt(infra, 0), undefined, undefined);
  net.monitor(linkOf(registry, 'up'));
  const nodeNets: NetHost[] = [];
  const links = nodeLinksOf(setup);
  for (let i = 0; i < setup.nodes; i++) {
    const rackNo = Math.floor(i / setup.rackSize);
    const zone = itemAt(zones, rackNo % zones.length);
    const rack = net.rack(`${zone.name}-r${rackNo}`, zone, setup.rackUplink);
    const link = itemAt(links, i);
    const start = link.steps[0];
    const host = net.host(`n${i}`, rack, start.up, start.down);
    net.monitor(linkOf(host, 'up'));
    nodeNets.push(host);
    // A link that changes mid-run (the emulated cluster's tc change at a given second).
    for (const step of link.steps.slice(1)) {
      queue.at(step.at, () => {
        net.setRate(linkOf(host, 'up'), step.up);
        net.setRate(linkOf(host, 'down'), step.down);
      });
    }
  }

  const world = new World(queue, net, registry, schedulerHost, setup.peer, random);
  const scheduling = new Scheduling(
    new Resources(),
    setup.scheduling,
    {
      // The real scheduler counts milliseconds.
      now: () => queue.now * 1000,
      triggerSeed: async (seed) => world.triggerSeed(seed.id, task),
    },
    setup.schedulerLog
      ? pino({ level: setup.schedulerLog, timestamp: () => `,"t":${queue.now.toFixed(3)}`, base: undefined }, pino.destination(2))
      : silentLogger,
  );
  world.scheduling = scheduling;
  const info = (net: NetHost, seed: boolean): HostInfo => ({
    id: net.name,
    hostname: net.name,
    ip: net.name,
    uploadPort: 65002,
    labels: { zone: net.zone.name, rack: net.rack.name },
    seed,
    uploadBandwidth: 0,
    uploadSlots: seed ? setup.uploadSlots.seed : setup.uploadSlots.node,
    uploadInUse: 0,
  });
  const seedDownloads: SimDownload[] = [];
  if (scenario !== 'direct') {
    for (let s = 0; s < setup.seeds; s++) {
      const zone = s % zones.length;
      const seedNet = net.host(`seed${s}`, itemAt(infra, zone), setup.seedUp, setup.seedDown);
      net.monitor(linkOf(seedNet, 'up'));
      world.addHost(seedNet, info(seedNet, true));
    }
  }
  const nodes = nodeNets.map((n) => (scenario === 'direct' ? undefined : world.addHost(n, info(n, false))));

  // ---- what each node does
  const ready = new Array<number>(setup.nodes).fill(NaN);
  const writtenAtReady = new Array<number>(setup.nodes).fill(0);
  let readyCount = 0;
  const markReady = (i: number, written: number) => {
    ready[i] = queue.now;
    writtenAtReady[i] = written;
    readyCount++;
  };
  const tocFirst = Math.floor(Math.max(0, setup.size - lazy.tocBytes) / pieceSize);
  const prefixLast = Math.min(task.pieceCount - 1, Math.max(0, Math.ceil((lazy.fraction * setup.size) / pieceSize) - 1));
  let neededPieces = task.pieceCount;
  if (scenario === 'lazy') {
    const needed = new Set<number>();
    for (let i = tocFirst; i < task.pieceCount; i++) needed.add(i);
    for (let i = 0; i <= prefixLast; i++) needed.add(i);
    neededPieces = needed.size;
  }
  const neededBytes = Math.min(setup.size, neededPieces * pieceSize);

  for (let i = 0; i < setup.nodes; i++) {
    const start = setup.startSpread > 0 ? random() * setup.startSpread : 0;
    const nodeNet = itemAt(nodeNets, i);
    const toRegistry = net.latency(nodeNet, registry);
    if (scenario === 'direct') {
      // containerd's GET straight to the registry.
      queue.at(start + toRegistry, () =>
        net.start(registry, nodeNet, setup.size, () => queue.after(toRegistry, () => markReady(i, setup.size))),
      );
      continue;
    }
    const host = nodes[i];
    if (!host) throw new Error(`node n${i} has no peer in a ${scenario} run`);
    // The mirror first asks the origin for the blob's size (HEAD), then opens the task.
    queue.at(start + 2 * toRegistry, () => {
      const download = host.download(task);
      if (scenario === 'p2p') {
        download.streaming = true;
        download.want(0, task.pieceCount - 1);
        download.whenStored(0, task.pieceCount - 1, () => markReady(i, download.bytesWritten));
        return;
      }
      // Lazy: the snapshotter reads the footer and TOC, then prefetches the prioritized files.
      download.want(tocFirst, task.pieceCount - 1);
      download.whenStored(tocFirst, task.pieceCount - 1, () => {
        download.want(0, prefixLast);
        download.whenStored(0, prefixLast, () => {
          markReady(i, download.bytesWritten);
          if (lazy.background) download.want(0, task.pieceCount - 1);
        });
      });
    });
  }

  // The scheduler's periodic pass, at a random phase.
  const tickMs: number[] = [];
  if (scenario !== 'direct') {
    const tick = () => {
      const started = performance.now();
      world.inScheduler(() => scheduling.tick());
      tickMs.push(performance.now() - started);
      queue.after(setup.tick, tick);
    };
    queue.at(random() * setup.tick, tick);
  }

  // Seeds read the whole blob whatever the nodes need: the run ends when they are done too.
  let triggeredSeeds = 0;
  const seedsIdle = () => {
    triggeredSeeds = 0;
    for (const host of world.hosts.values()) if (host.seed) triggeredSeeds += host.tasks.size;
    return world.completed.seed === triggeredSeeds;
  };
  const allReady = () => readyCount === setup.nodes;
  const nodesSettled = () => scenario !== 'lazy' || !lazy.background || world.completed.node === setup.nodes;
  let checks = 0;
  let lastReport = performance.now();
  const finished = () => {
    if (progress && ++checks % 20000 === 0 && performance.now() - lastReport > 30_000) {
      lastReport = performance.now();
      progress(
        `  … ${scenario}: simulated ${queue.now.toFixed(1)} s, ${readyCount}/${setup.nodes} nodes ready, ` +
          `wall ${((lastReport - wallStart) / 1000).toFixed(0)} s (scheduler ${(world.schedulerMs / 1000).toFixed(0)} s)`,
      );
    }
    return allReady() && nodesSettled() && seedsIdle() && net.flowCount === 0;
  };
  runUntil(queue, net, finished);
  if (!allReady()) throw new Error(`simulation stopped with ${setup.nodes - readyCount} nodes not ready`);
  for (const host of world.hosts.values()) if (host.seed) for (const d of host.tasks.values()) seedDownloads.push(d);

  const sorted = [...ready].sort((a, b) => a - b);
  const first = itemAt(sorted, 0);
  const last = itemAt(sorted, sorted.length - 1);
  const lb = lowerBound({
    F: neededBytes,
    us: setup.registryUp / 8,
    ui: links.map((l) => l.steps[0].up / 8),
    dmin: Math.min(...links.map((l) => l.steps[0].down / 8)),
  });
  const bounds = nodeBounds(neededBytes, setup.registryUp, links).map((b) => b.seconds);
  const groups = links.map((l) => l.group);
  const samples = net.samples(linkOf(registry, 'up'));
  const nodeDownloads = nodes.map((h) => h?.tasks.get(task.id)).filter((d): d is SimDownload => !!d);
  const sum = (values: number[]) => values.reduce((a, b) => a + b, 0);
  const stat = scheduling.stat(task.id);
  const seedHosts = [...world.hosts.values()].filter((h) => h.seed);
  return {
    scenario,
    nodes: setup.nodes,
    size: setup.size,
    pieceSize,
    pieceCount: task.pieceCount,
    ready,
    first,
    median: median(ready),
    last,
    neededBytes,
    lowerBound: lb,
    ratio: last / lb.seconds,
    bounds,
    groups,
    ownBound: boundRatios(ready.map((done, i) => ({ node: `n${i}`, done, bound: itemAt(bounds, i), group: itemAt(groups, i) }))),
    registryBytes: integrate(samples, last),
    registryBytesTotal: registry.sent,
    registryPeakBps: Math.max(0, ...samples.map((s) => s.rate)) * 8,
    registrySamples: samples,
    writtenAtReady: sum(writtenAtReady) / setup.nodes,
    writtenAtEnd: scenario === 'direct' ? setup.size : sum(nodeDownloads.map((d) => d.bytesWritten)) / setup.nodes,
    copiesFromSeeds: sum(nodeDownloads.map((d) => d.bytesFrom.seed)) / setup.size,
    copiesFromNodes: sum(nodeDownloads.map((d) => d.bytesFrom.peer)) / setup.size,
    copiesFromOrigin: scenario === 'direct' ? setup.nodes : sum(nodeDownloads.map((d) => d.bytesFrom.origin)) / setup.size,
    seedUploadCopies: sum(seedHosts.map((h) => h.net.sent)) / setup.size,
    seedUploadUse: seedHosts.length
      ? sum(seedHosts.map((h) => integrate(net.samples(linkOf(h.net, 'up')), last))) /
        (seedHosts.length * (setup.seedUp / 8) * setup.efficiency * last)
      : 0,
    nodeUploadUse:
      scenario === 'direct'
        ? 0
        : sum(nodeNets.map((h) => integrate(net.samples(linkOf(h, 'up')), last))) /
          (sum(links.map((l) => l.steps[0].up / 8)) * setup.efficiency * last),
    schedulerMs: world.schedulerMs,
    schedulerCalls: world.schedulerCalls,
    tickMs,
    cyclesDetected: stat?.cyclesDetected ?? 0,
    events: queue.processed,
    recomputations: net.recomputations,
    busyAnswers: world.busyAnswers,
    duplicateBytes: world.duplicateBytes,
    abortedBytes: net.abortedBytes,
    simulatedSeconds: queue.now,
    wallMs: performance.now() - wallStart,
  };
}

/** A host's link that the run measures or changes: the set-up gives each such link a finite rate. */
function linkOf(host: NetHost, side: 'up' | 'down'): Link {
  const link = host[side];
  if (!link) throw new Error(`${host.name} has no ${side}load rate: an uncapped link cannot be measured or changed`);
  return link;
}

/** Bytes sent under a load step function from 0 to `until`. */
export function integrate(samples: LoadSample[], until: number): number {
  let bytes = 0;
  for (let i = 0; i < samples.length; i++) {
    const { t: from, rate } = itemAt(samples, i);
    if (from >= until) break;
    const to = Math.min(until, samples[i + 1]?.t ?? until);
    bytes += rate * (to - from);
  }
  return bytes;
}
