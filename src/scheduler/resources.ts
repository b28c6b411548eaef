import { itemAt } from '../common/indexing.js';
import type { HostInfo, OriginRequest, SchedulerPacket } from '../rpc/scheduler-api.js';
import { LinkKnowledge, PeerPace } from './pace.js';
import { PieceSet } from './piece-set.js';

/** A machine running a peer daemon (or a seed). */
export class Host {
  readonly peers = new Set<Peer>();
  /** What its links were measured to allow (the adaptive shape places by it). */
  readonly links = new LinkKnowledge();
  constructor(
    public info: HostInfo,
    public lastSeen: number,
  ) {}
  get id(): string {
    return this.info.id;
  }
  get isSeed(): boolean {
    return this.info.seed;
  }
  /** Children currently assigned to this host's peers, across tasks: its upload load. */
  get childCount(): number {
    let count = 0;
    for (const peer of this.peers) count += peer.children.size;
    return count;
  }
  get uploadSlots(): number {
    return this.info.uploadSlots > 0 ? this.info.uploadSlots : 8;
  }
}

/** How long a reported piece start counts without the piece being stored. */
export const GROWING_TTL_MS = 30_000;

export type PeerState = 'waiting' | 'running' | 'backToSource' | 'finished' | 'left';

/** Drops in a peer's children remembered (Peer.childrenSince): a piece spans a few at most. */
const SHARES_KEPT = 8;

/** One host's participation in one task, alive while its AnnouncePeer stream is open. */
export class Peer {
  readonly pieces: PieceSet;
  parents: Peer[] = [];
  readonly children = new Set<Peer>();
  /** Parents this peer must not be given again (failed or served bad data to it). */
  readonly blocklist = new Set<string>();
  state: PeerState = 'waiting';
  /**
   * The peer said it wants no piece for now (a lazy reader between reads): it is given no parents
   * until it asks again, so that its parents' upload slots go to children that need them.
   */
  idle = false;
  /** Scheduling rounds that found no parent. */
  fruitlessRounds = 0;
  /** Failures of this peer as a parent (timestamps), for the penalty in scoring. */
  readonly failuresAsParent: number[] = [];
  /** Moving average of milliseconds per MiB when children fetched from this peer. */
  costPerMiB?: number;
  readonly bytesByParentHost = new Map<string, number>();
  /**
   * Pieces arriving at this peer now (index → when it said so): it relays their bytes as they
   * come, so it can serve them before storing them. Stored pieces leave the map; a piece whose
   * fetch gave up is not reported, so entries also go stale after GROWING_TTL_MS.
   */
  readonly growing = new Map<number, number>();
  /** The parent each piece of `growing` comes from, when the peer said (absent: the origin, or not said). */
  readonly growingFrom = new Map<number, string>();
  /** The pieces of `growing`, as a bitset for the every-pair checks of parent selection. */
  readonly arriving: PieceSet;
  /** The pieces of `growing` that a workload waits for (not wanted in the background only). */
  readonly awaitedArriving = new Set<number>();
  /** What its reports showed of its transfers (adaptive shape). */
  readonly pace = new PeerPace();
  /** Pieces it reported a digest for while on this stream. */
  readonly reportedDigests: PieceSet;
  /**
   * The digests among those that were not the task's digest then (usually none): with the task's
   * digests, what it holds if its whole blob verifies.
   */
  readonly ownDigests = new Map<number, string>();
  /** When its parent set last changed: a piece started before was asked of another parent. */
  parentsSince = 0;
  /** When its last room trial ended (adaptive.ts tryRoom): pieces its children began before then judge nothing. */
  roomTrialEndedAt?: number;
  /**
   * When children last stopped sharing its upload, each with how many shared it until then (the
   * latest few): a piece a child began before came at a smaller share than the peer gives now.
   */
  private readonly sharedBefore: Array<{ until: number; children: number }> = [];

  /** A child stopped taking its upload at `now` (moved, finished, gone). */
  childLeft(now: number): void {
    this.sharedBefore.push({ until: now, children: this.children.size + 1 });
    if (this.sharedBefore.length > SHARES_KEPT) this.sharedBefore.shift();
  }

  /** The most children that shared its upload at one time since `since`, now included. */
  childrenSince(since: number): number {
    let most = this.children.size;
    for (const shared of this.sharedBefore) if (shared.until > since) most = Math.max(most, shared.children);
    return most;
  }

  constructor(
    readonly id: string,
    readonly host: Host,
    readonly task: Task,
    readonly send: (packet: SchedulerPacket) => void,
    /** When it registered for the task. */
    readonly joinedAt = 0,
    /** Ends the peer's stream when the scheduler drops it unasked, so that it registers again. */
    readonly disconnect: (reason: string) => void = () => undefined,
  ) {
    this.pieces = new PieceSet(task.pieceCount);
    this.arriving = new PieceSet(task.pieceCount);
    this.reportedDigests = new PieceSet(task.pieceCount);
  }

  get isSeed(): boolean {
    return this.host.isSeed;
  }
  get isFinished(): boolean {
    return this.state === 'finished' || this.pieces.size >= this.task.pieceCount;
  }

  /** A piece began arriving at this peer (PieceStarted); `awaited`: a workload waits for it. */
  pieceArriving(index: number, now: number, awaited = false, parentId?: string): void {
    this.growing.set(index, now);
    if (parentId === undefined) this.growingFrom.delete(index);
    else this.growingFrom.set(index, parentId);
    this.arriving.add(index);
    if (awaited) this.awaitedArriving.add(index);
    else this.awaitedArriving.delete(index);
  }

  /** A piece is stored here: it is no longer on its way. */
  pieceStored(index: number): void {
    this.pieces.add(index);
    this.growing.delete(index);
    this.growingFrom.delete(index);
    this.arriving.delete(index);
    this.awaitedArriving.delete(index);
  }

  /**
   * The pieces of `growing` asked of its present parents (index → when their first byte came):
   * from one of them, as the peer said, or (not said) begun since they became its parents.
   */
  arrivingFromParents(): Array<[number, number]> {
    return [...this.growing].filter(([index, start]) => {
      const from = this.growingFrom.get(index);
      return from === undefined ? start >= this.parentsSince : this.parents.some((parent) => parent.id === from);
    });
  }

  /** Forgets piece starts that were never followed by the piece (GROWING_TTL_MS). */
  forgetStaleStarts(now: number): void {
    for (const [index, since] of this.growing) this.forgetIfStale(index, since, now);
  }

  /** Forgets one start if it went stale; whether it did. */
  private forgetIfStale(index: number, since: number, now: number): boolean {
    if (now - since <= GROWING_TTL_MS) return false;
    this.growing.delete(index);
    this.growingFrom.delete(index);
    this.arriving.delete(index);
    this.awaitedArriving.delete(index);
    return true;
  }

  /**
   * Whether a piece arriving at this peer now is one that `other` neither holds nor is receiving
   * (forgetting, on the way, starts that went stale here).
   */
  relaysPieceMissingFrom(other: Peer, now: number): boolean {
    for (const [index, since] of this.growing) {
      if (!this.forgetIfStale(index, since, now) && !other.pieces.has(index) && !other.arriving.has(index)) return true;
    }
    return false;
  }

  recentFailures(now: number, windowMs = 60_000): number {
    while (this.failuresAsParent.length && itemAt(this.failuresAsParent, 0) < now - windowMs) this.failuresAsParent.shift();
    return this.failuresAsParent.length;
  }

  recordCost(costMs: number, bytes: number): void {
    if (bytes <= 0) return;
    const perMiB = costMs / (bytes / 2 ** 20);
    this.costPerMiB = this.costPerMiB === undefined ? perMiB : 0.7 * this.costPerMiB + 0.3 * perMiB;
  }
}

/** The adaptive shape's view of a task (adaptive.ts, placement.ts). */
export interface AdaptiveTaskState {
  /** When pieces still arriving were last checked. */
  checkedAt: number;
  /** The most a node (not a seed) of the task was measured to receive, bytes per ms: what "slow" is measured against. */
  referenceRate: number;
  /** A node not found slow itself was measured: the reference says how fast nodes are. */
  referenceConfirmed: boolean;
  /** Chain ends moved under a seed to find the reference (placement.ts chainToSplit). */
  probes: Peer[];
  /** Peers trying one chain more than their measured room, with the trial (adaptive.ts tryRoom). */
  roomTrials: Map<Peer, RoomTrial>;
}

/** A peer feeding one chain more to learn whether its upload carries it (placement.ts roomToTry). */
export interface RoomTrial {
  /** The chain peer moved under the peer trying, and the parent it came from (it goes back if there is no room). */
  readonly child: Peer;
  readonly from: Peer | undefined;
  readonly since: number;
  /** The chains the seed fed before, at this pace (bytes per ms). */
  readonly chains: number;
  readonly pace: number;
}

/** Where a task is kept: its blob digest as read from one origin registry. */
export function taskKey(id: string, registry: string): string {
  return `${registry} ${id}`;
}

/**
 * One blob being distributed; its id is the blob digest. Peers reading it from different origin
 * registries are different tasks: piece digests are learnt from a peer that read the origin, and
 * are only as good as that registry (another one could be an attacker's, lying in ranges).
 */
export class Task {
  readonly peers = new Map<string, Peer>();
  /**
   * Piece digests reported by peers that read the origin with the scheduler's permission (the
   * registry's word), replaced by confirmed ones once a peer's whole blob verifies.
   */
  readonly digests = new Map<number, string>();
  /** Pieces whose digest is confirmed: a peer holding a piece with it verified the whole blob. */
  readonly confirmed = new Set<number>();
  readonly bytes = { peer: 0, seed: 0, origin: 0 };
  origin?: OriginRequest;
  /** Seeds asked to fetch this task (so none is asked twice), with when and whether that failed. */
  readonly triggeredSeeds = new Map<string, { at: number; failed: boolean }>();
  cyclesDetected = 0;
  lastActive: number;
  /** What the adaptive shape keeps of the task as a whole (adaptive.ts). */
  readonly adaptive: AdaptiveTaskState = {
    checkedAt: 0,
    referenceRate: 0,
    referenceConfirmed: false,
    probes: [],
    roomTrials: new Map(),
  };

  constructor(
    readonly id: string,
    /** The origin registry, scheme://host[:port] ('' when peers named none). */
    readonly registry: string,
    readonly contentLength: number,
    readonly pieceSize: number,
    now: number,
  ) {
    this.lastActive = now;
  }

  get key(): string {
    return taskKey(this.id, this.registry);
  }

  get pieceCount(): number {
    return Math.max(1, Math.ceil(this.contentLength / this.pieceSize));
  }

  /** Peers allowed to read the origin right now. */
  get originReaders(): Peer[] {
    return [...this.peers.values()].filter((peer) => peer.state === 'backToSource');
  }
}

/** Everything the scheduler knows: hosts, tasks and their peers. */
export class Resources {
  readonly hosts = new Map<string, Host>();
  readonly tasks = new Map<string, Task>();

  upsertHost(info: HostInfo, now: number): Host {
    const existing = this.hosts.get(info.id);
    if (existing) {
      existing.info = info;
      existing.lastSeen = now;
      existing.links.announced(info.uploadBandwidth);
      return existing;
    }
    const host = new Host(info, now);
    host.links.announced(info.uploadBandwidth);
    this.hosts.set(info.id, host);
    return host;
  }

  task(id: string, contentLength: number, pieceSize: number, now: number, registry = ''): Task {
    const key = taskKey(id, registry);
    let task = this.tasks.get(key);
    if (!task) {
      task = new Task(id, registry, contentLength, pieceSize, now);
      this.tasks.set(key, task);
    }
    return task;
  }

  /** The task of blob `id` read from `registry`; without one, the task of that blob with the most peers. */
  findTask(id: string, registry?: string): Task | undefined {
    if (registry !== undefined) return this.tasks.get(taskKey(id, registry));
    let best: Task | undefined;
    for (const task of this.tasks.values()) if (task.id === id && (!best || task.peers.size > best.peers.size)) best = task;
    return best;
  }

  seedHosts(): Host[] {
    return [...this.hosts.values()].filter((host) => host.isSeed);
  }
}

/** True if `parent` can already reach `child` through parent edges: adding child→parent would close a cycle. */
/**
 * The peers below `peer` in the parent graph (its children, theirs, and so on). Making any of
 * them a parent of `peer` would close a cycle. One walk serves every candidate of a child.
 */
export function descendantsOf(peer: Peer): Set<Peer> {
  const seen = new Set<Peer>();
  const stack = [...peer.children];
  for (let current = stack.pop(); current !== undefined; current = stack.pop()) {
    if (seen.has(current)) continue;
    seen.add(current);
    for (const child of current.children) stack.push(child);
  }
  return seen;
}

/** An independent check of the whole parent graph of a task (the tests hold the scheduler to it). */
export function graphHasCycle(task: Task): boolean {
  const state = new Map<Peer, 'visiting' | 'done'>();
  const visit = (peer: Peer): boolean => {
    const mark = state.get(peer);
    if (mark === 'visiting') return true;
    if (mark === 'done') return false;
    state.set(peer, 'visiting');
    for (const parent of peer.parents) if (visit(parent)) return true;
    state.set(peer, 'done');
    return false;
  };
  for (const peer of task.peers.values()) if (visit(peer)) return true;
  return false;
}
