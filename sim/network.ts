// A flow-level network: every transfer is a flow over a path of capacitated links (the
// sender's uplink, the rack and zone uplinks it leaves through, the zone and rack downlinks
// it enters through, the receiver's downlink). Rates are max-min fair, found by progressive
// filling, and recomputed when flows start or end. A request also pays the one-way latency
// between the two hosts, which depends on whether they share a rack or a zone.
//
// With `quantum` > 0, recomputations are coalesced: after a change the rates are recomputed
// at most once per quantum of simulated time; a flow that starts in between gets no bandwidth
// until then, and a finished flow's share stays unused until then. Each transfer can thus
// start up to one quantum late (an error of quantum / transfer time). quantum = 0 is exact.

import { itemAt } from '../src/common/indexing.js';
import type { EventQueue } from './event-queue.js';

/** The capacity of a relay cap whose feeding flow has ended. */
const UNCAPPED = 1e15;

export class Link {
  readonly flows: Flow[] = [];
  /** Sum of the current rates of the flows on this link (bytes/s). */
  load = 0;
  // scratch for the progressive filling
  remaining = 0;
  unfixed = 0;
  unfixedWeight = 0;
  version = 0;
  constructor(
    readonly name: string,
    /** Payload bytes per second (a relay cap follows the rate of the flow that feeds it). */
    public capacity: number,
  ) {}
}

export class Flow {
  /** Bytes still to send (as of `last`). */
  remaining: number;
  /** Bytes this flow was created or extended with, in total. */
  total: number;
  rate = 0;
  last: number;
  finishAt = Infinity;
  active = true;
  /** Share of a bottleneck relative to the other flows on it (1 = equal shares). */
  weight = 1;
  /** Position of this flow in each path link's `flows` array. */
  readonly slots: number[];
  /**
   * A relayed flow: its bytes are those still arriving through `feed`, so it can go no faster
   * than that flow while it lasts. The cap is a private link at the end of the path.
   */
  feed?: Flow;
  constructor(
    readonly src: NetHost,
    readonly dst: NetHost,
    readonly path: Link[],
    bytes: number,
    now: number,
    public onDone: (flow: Flow) => void,
  ) {
    this.remaining = bytes;
    this.total = bytes;
    this.last = now;
    this.slots = new Array<number>(path.length).fill(-1);
  }
}

export interface Zone {
  name: string;
  up?: Link;
  down?: Link;
}

export interface Rack {
  name: string;
  zone: Zone;
  up?: Link;
  down?: Link;
}

export class NetHost {
  /** Payload bytes that left / arrived at this host, counted when each flow ends. */
  sent = 0;
  received = 0;
  constructor(
    readonly name: string,
    readonly up: Link | undefined,
    readonly down: Link | undefined,
    readonly rack: Rack,
  ) {}
  get zone(): Zone {
    return this.rack.zone;
  }
}

export interface Latency {
  /** One-way seconds between two hosts of one rack. */
  sameRack: number;
  /** ... of one zone, different racks. */
  crossRack: number;
  /** ... of different zones. */
  crossZone: number;
}

export interface NetworkOptions {
  /** Payload share of the link rate (TCP/IP headers and framing): 1448/1514 for tc-shaped Ethernet. */
  efficiency: number;
  /** Seconds; 0 recomputes rates at every change. */
  quantum: number;
  latency: Latency;
  /**
   * Unequal sharing (TCP is only roughly fair): each flow's weight in the weighted max-min
   * allocation is exp(noise · Z), Z standard normal, drawn once per flow. 0 = equal shares.
   */
  noise?: number;
  /** Random numbers in [0, 1) for the noise. */
  random?: () => number;
}

/** A step function of a link's load over time: rate (bytes/s) from each `t` until the next. */
export interface LoadSample {
  t: number;
  rate: number;
}

export class Network {
  private readonly zones = new Map<string, Zone>();
  private readonly racks = new Map<string, Rack>();
  readonly hosts: NetHost[] = [];
  private readonly active = new Set<Flow>();
  /** Flows with a rate, by finishing time (rebuilt at every recomputation). */
  private heap: Flow[] = [];
  private dirty = false;
  /** When the pending recomputation runs; Infinity when none is pending. */
  recomputeAt = Infinity;
  private lastRecompute = -Infinity;
  recomputations = 0;
  /** Bytes that transfers stopped before their end had sent (thrown away by the receiver). */
  abortedBytes = 0;
  private readonly monitors = new Map<Link, LoadSample[]>();

  constructor(
    private readonly queue: EventQueue,
    readonly options: NetworkOptions,
  ) {}

  /** Bits per second → payload bytes per second; undefined or Infinity → no link (uncapped). */
  private link(name: string, bitsPerSecond: number | undefined): Link | undefined {
    if (bitsPerSecond === undefined || !Number.isFinite(bitsPerSecond)) return undefined;
    if (!(bitsPerSecond > 0)) throw new Error(`link ${name} needs a positive rate`);
    return new Link(name, (bitsPerSecond / 8) * this.options.efficiency);
  }

  zone(name: string, uplink?: number, downlink = uplink): Zone {
    let zone = this.zones.get(name);
    if (!zone) {
      zone = { name, up: this.link(`${name}:up`, uplink), down: this.link(`${name}:down`, downlink) };
      this.zones.set(name, zone);
    }
    return zone;
  }

  rack(name: string, zone: Zone, uplink?: number, downlink = uplink): Rack {
    let rack = this.racks.get(name);
    if (!rack) {
      rack = { name, zone, up: this.link(`${name}:up`, uplink), down: this.link(`${name}:down`, downlink) };
      this.racks.set(name, rack);
    }
    if (rack.zone !== zone) throw new Error(`rack ${name} is in zone ${rack.zone.name}, not ${zone.name}`);
    return rack;
  }

  /** A host with its NIC's upload and download rates in bits/s (undefined: uncapped). */
  host(name: string, rack: Rack, up: number | undefined, down: number | undefined = up): NetHost {
    const host = new NetHost(name, this.link(`${name}:up`, up), this.link(`${name}:down`, down), rack);
    this.hosts.push(host);
    return host;
  }

  latency(a: NetHost, b: NetHost): number {
    if (a === b) return 0;
    const l = this.options.latency;
    if (a.rack === b.rack) return l.sameRack;
    if (a.zone === b.zone) return l.crossRack;
    return l.crossZone;
  }

  path(src: NetHost, dst: NetHost): Link[] {
    const path: Link[] = [];
    if (src.up) path.push(src.up);
    if (src.rack !== dst.rack) {
      if (src.rack.up) path.push(src.rack.up);
      if (src.zone !== dst.zone) {
        if (src.zone.up) path.push(src.zone.up);
        if (dst.zone.down) path.push(dst.zone.down);
      }
      if (dst.rack.down) path.push(dst.rack.down);
    }
    if (dst.down) path.push(dst.down);
    return path;
  }

  /** Changes a link's rate (bits/s) from now on: a NIC that slows down mid-run. */
  setRate(link: Link, bitsPerSecond: number): void {
    if (!(bitsPerSecond > 0)) throw new Error(`link ${link.name} needs a positive rate`);
    // The next recomputation moves every flow on at its old rate up to now, then shares the new capacity.
    link.capacity = (bitsPerSecond / 8) * this.options.efficiency;
    this.markDirty();
  }

  /** Records the load of `link` over time (see `samples`). */
  monitor(link: Link): void {
    if (!this.monitors.has(link)) this.monitors.set(link, [{ t: this.queue.now, rate: link.load }]);
  }

  samples(link: Link): LoadSample[] {
    return this.monitors.get(link) ?? [];
  }

  get flowCount(): number {
    return this.active.size;
  }

  /** Starts sending `bytes` from `src` to `dst` now; `onDone` runs when the last byte has left. */
  start(src: NetHost, dst: NetHost, bytes: number, onDone: (flow: Flow) => void, feed?: Flow): Flow {
    const path = this.path(src, dst);
    if (feed?.active) path.push(new Link(`relay ${src.name}->${dst.name}`, UNCAPPED));
    const flow = new Flow(src, dst, path, bytes, this.queue.now, onDone);
    if (feed?.active) flow.feed = feed;
    const noise = this.options.noise ?? 0;
    if (noise > 0) flow.weight = Math.exp(noise * normal(this.options.random ?? Math.random));
    if (path.length === 0) throw new Error(`no capped link between ${src.name} and ${dst.name}: the flow would be infinitely fast`);
    for (let i = 0; i < path.length; i++) {
      const link = itemAt(path, i);
      flow.slots[i] = link.flows.length;
      link.flows.push(flow);
    }
    this.active.add(flow);
    if (bytes <= 0) {
      // Nothing to send: done at once (as an event, so the caller's state is settled first).
      flow.finishAt = this.queue.now;
      this.push(flow);
    }
    this.markDirty();
    return flow;
  }

  /** Stops a flow before its end (an aborted request); counts the bytes it had sent. */
  cancel(flow: Flow): void {
    if (!flow.active) return;
    this.progress(flow, this.queue.now);
    this.abortedBytes += flow.total - flow.remaining;
    this.detach(flow);
    this.markDirty();
  }

  /**
   * From inside `onDone`: the same sender keeps sending `bytes` more on the same connection
   * (a stream cut into pieces). The flow keeps its share, so no recomputation is needed.
   */
  extend(flow: Flow, bytes: number): void {
    flow.remaining = bytes;
    flow.total += bytes;
    flow.last = this.queue.now;
    flow.active = true;
    flow.finishAt = flow.rate > 0 ? this.queue.now + bytes / flow.rate : Infinity;
    if (flow.rate > 0) this.push(flow);
  }

  /** Bytes a flow has sent so far. */
  delivered(flow: Flow): number {
    const elapsed = flow.active && flow.rate > 0 ? this.queue.now - flow.last : 0;
    return flow.total - Math.max(0, flow.remaining - flow.rate * elapsed);
  }

  /** Time of the next flow completion. */
  nextCompletion(): number {
    const heap = this.heap;
    while (heap[0]?.active === false) this.pop();
    return heap[0]?.finishAt ?? Infinity;
  }

  /** Ends the flow that finishes first (the clock is already at its finishing time). */
  completeNext(): void {
    const flow = this.pop();
    if (!flow) return;
    const now = this.queue.now;
    flow.remaining = 0;
    flow.last = now;
    flow.active = false; // extend() may revive it
    flow.onDone(flow);
    if (flow.active) return; // extended: same share, same links
    this.count(flow, flow.total);
    this.detach(flow, false);
    this.markDirty();
  }

  /** Recomputes every flow's max-min fair rate (the clock is at `recomputeAt`). */
  recompute(): void {
    const now = this.queue.now;
    this.recomputeAt = Infinity;
    this.dirty = false;
    this.lastRecompute = now;
    this.recomputations++;
    const links = new Set<Link>();
    for (const flow of this.active) {
      this.progress(flow, now);
      flow.rate = -1;
      for (const link of flow.path) links.add(link);
    }
    this.fill(links);
    // A relayed flow goes no faster than the flow that feeds it: cap it at that rate and fill
    // again (once; a chain of relays is capped by its feeder's first-pass rate).
    let relayed = false;
    for (const flow of this.active) {
      if (!flow.feed) continue;
      relayed = true;
      itemAt(flow.path, flow.path.length - 1).capacity = flow.feed.active ? Math.max(flow.feed.rate, 1) : UNCAPPED;
      if (!flow.feed.active) flow.feed = undefined;
    }
    if (relayed) {
      for (const flow of this.active) flow.rate = -1;
      this.fill(links);
    }
    const flows: Flow[] = [];
    for (const flow of this.active) {
      if (flow.rate < 0) flow.rate = 0;
      flow.finishAt = flow.rate > 0 ? now + flow.remaining / flow.rate : Infinity;
      if (flow.rate > 0) flows.push(flow);
    }
    this.heap = flows;
    for (let i = (flows.length >> 1) - 1; i >= 0; i--) this.siftDown(i);
    for (const [link, samples] of this.monitors) this.sample(link, samples, now);
  }

  /** Progressive filling: the link with the smallest fair share (per unit of weight) fixes the
   * rate of all its flows; their bandwidth is taken off their other links; repeat. */
  private fill(links: Set<Link>): void {
    const heap = new ShareHeap();
    for (const link of links) {
      link.remaining = link.capacity;
      link.unfixed = link.flows.length;
      let weight = 0;
      for (const flow of link.flows) weight += flow.weight;
      link.unfixedWeight = weight;
      link.version++;
      link.load = 0;
      heap.push(link.remaining / weight, link, link.version);
    }
    for (;;) {
      const top = heap.pop();
      if (!top) break;
      const link = top.link;
      if (top.version !== link.version || link.unfixed === 0) continue;
      const share = Math.max(0, link.remaining / link.unfixedWeight);
      for (const flow of link.flows) {
        if (flow.rate >= 0) continue;
        const rate = share * flow.weight;
        flow.rate = rate;
        for (const other of flow.path) {
          other.load += rate;
          if (other === link) continue;
          other.remaining -= rate;
          other.unfixed--;
          other.unfixedWeight -= flow.weight;
          other.version++;
          if (other.unfixed > 0) heap.push(Math.max(0, other.remaining) / Math.max(1e-12, other.unfixedWeight), other, other.version);
        }
      }
      link.unfixed = 0;
      link.unfixedWeight = 0;
      link.remaining = 0;
    }
  }

  private markDirty(): void {
    this.dirty = true;
    if (this.recomputeAt === Infinity) this.recomputeAt = Math.max(this.queue.now, this.lastRecompute + this.options.quantum);
  }

  private progress(flow: Flow, now: number): void {
    if (flow.rate > 0 && now > flow.last) flow.remaining = Math.max(0, flow.remaining - flow.rate * (now - flow.last));
    flow.last = now;
  }

  private count(flow: Flow, bytes: number): void {
    flow.src.sent += bytes;
    flow.dst.received += bytes;
  }

  /** Takes a flow off its links (its share stays unused until the next recomputation). */
  private detach(flow: Flow, countPartial = true): void {
    if (countPartial) this.count(flow, flow.total - flow.remaining);
    flow.active = false;
    this.active.delete(flow);
    for (let i = 0; i < flow.path.length; i++) {
      const link = itemAt(flow.path, i);
      const at = itemAt(flow.slots, i);
      const last = link.flows.pop();
      if (last === undefined) throw new Error(`flow ${flow.src.name}->${flow.dst.name} is not on link ${link.name}`);
      if (last !== flow) {
        link.flows[at] = last;
        last.slots[last.path.indexOf(link)] = at;
      }
      link.load -= flow.rate;
      if (link.load < 1e-9 * link.capacity) link.load = 0;
      const samples = this.monitors.get(link);
      if (samples) this.sample(link, samples, this.queue.now);
    }
    flow.rate = 0;
  }

  private sample(link: Link, samples: LoadSample[], now: number): void {
    const last = samples[samples.length - 1];
    if (last && Math.abs(last.rate - link.load) <= 1e-9 * link.capacity) return;
    if (last && last.t === now) last.rate = link.load;
    else samples.push({ t: now, rate: link.load });
  }

  // ---- completion heap (min finishAt)

  private push(flow: Flow): void {
    const heap = this.heap;
    heap.push(flow);
    let i = heap.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      const above = itemAt(heap, parent);
      if (above.finishAt <= flow.finishAt) break;
      heap[i] = above;
      i = parent;
    }
    heap[i] = flow;
  }

  private pop(): Flow | undefined {
    const heap = this.heap;
    const top = heap[0];
    const last = heap.pop();
    if (top === undefined || last === undefined) return undefined;
    if (heap.length) {
      heap[0] = last;
      this.siftDown(0);
    }
    return top;
  }

  private siftDown(i: number): void {
    const heap = this.heap;
    const n = heap.length;
    const item = itemAt(heap, i);
    for (;;) {
      const l = 2 * i + 1;
      if (l >= n) break;
      const r = l + 1;
      const c = r < n && itemAt(heap, r).finishAt < itemAt(heap, l).finishAt ? r : l;
      const child = itemAt(heap, c);
      if (item.finishAt <= child.finishAt) break;
      heap[i] = child;
      i = c;
    }
    heap[i] = item;
  }
}

/** A standard normal variate (Box–Muller). */
function normal(random: () => number): number {
  const u = 1 - random();
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * random());
}

/** A min-heap of (share, link) with stale entries skipped by version. */
class ShareHeap {
  private keys: number[] = [];
  private links: Link[] = [];
  private versions: number[] = [];

  push(key: number, link: Link, version: number): void {
    const { keys, links, versions } = this;
    let i = keys.length;
    keys.push(key);
    links.push(link);
    versions.push(version);
    while (i > 0) {
      const parent = (i - 1) >> 1;
      const parentKey = itemAt(keys, parent);
      if (parentKey <= key) break;
      keys[i] = parentKey;
      links[i] = itemAt(links, parent);
      versions[i] = itemAt(versions, parent);
      i = parent;
    }
    keys[i] = key;
    links[i] = link;
    versions[i] = version;
  }

  pop(): { link: Link; version: number } | undefined {
    const { keys, links, versions } = this;
    if (!keys.length) return undefined;
    const out = { link: itemAt(links, 0), version: itemAt(versions, 0) };
    const key = itemAt(keys, keys.length - 1);
    const link = itemAt(links, links.length - 1);
    const version = itemAt(versions, versions.length - 1);
    keys.pop();
    links.pop();
    versions.pop();
    const n = keys.length;
    if (n) {
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        if (l >= n) break;
        const r = l + 1;
        const c = r < n && itemAt(keys, r) < itemAt(keys, l) ? r : l;
        const childKey = itemAt(keys, c);
        if (key <= childKey) break;
        keys[i] = childKey;
        links[i] = itemAt(links, c);
        versions[i] = itemAt(versions, c);
        i = c;
      }
      keys[i] = key;
      links[i] = link;
      versions[i] = version;
    }
    return out;
  }
}

/** Runs the queue's events and the network's completions and recomputations in time order. */
export function runUntil(queue: EventQueue, net: Network, done: () => boolean, limitSeconds = Infinity): void {
  while (!done()) {
    const tc = net.nextCompletion();
    const te = queue.peekTime();
    const tr = net.recomputeAt;
    const t = Math.min(tc, te, tr);
    if (t === Infinity || t > limitSeconds) return;
    if (tc <= te && tc <= tr) {
      queue.advanceTo(tc);
      net.completeNext();
    } else if (te <= tr) {
      queue.runNext();
    } else {
      queue.advanceTo(tr);
      net.recompute();
    }
  }
}
