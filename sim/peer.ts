// Simulated Starling peers. Each SimDownload plays one host's part in one task the way
// src/peer/swarm/swarm-download.ts, parent-link.ts and src/peer/upload/server.ts do it, with
// the simulator's clock and network instead of timers and sockets. Every rule of the piece
// policy is the peer's own, imported from src/peer/swarm/policy/ (a copy here had drifted from
// the peer before): the candidate order, the parent choice and per-parent limits, the busy
// backoff and parent pace, the endgame, the stall rules, the origin's read order.
//
//  - it registers with the (real) scheduler and follows its packets: parents, wait, digests,
//    back-to-source; it reports every stored piece (with parent, cost, and for origin reads the
//    digest), failures, reschedule requests and the end of the download;
//  - it follows each parent's piece bitmap (the long poll: a parent's new piece is known to the
//    child one latency after it is stored or begins to arrive);
//  - it fetches up to `parallelism` pieces at once, at most `perParent` from one parent, in the
//    policy's order (candidate-order.ts) from the policy's parent (parent-choice.ts); only pieces
//    whose digest the scheduler vouched for are fetched; at the tail (every wanted piece stored
//    or on its way) the endgame asks a second parent for a straggler (endgame.ts);
//  - a parent's upload server serves at most `uploadSlots` pieces at once and answers 429
//    beyond that (the child then leaves that parent alone for its busy backoff);
//  - a fetch slot freed by a stored piece is refilled at once; one freed by a failed attempt (a
//    429, a missing piece) RETRY_AFTER_FAILED_PIECE_MS later (or at the next event that pumps: a
//    new piece at a parent, a packet), as the real peer does;
//  - the watchdog pumps, asks for a reschedule and goes to the origin by the policy's stall
//    rules (stall.ts); the real peer gives up a piece only when no byte of it arrives for
//    `pieceTimeoutMs`, which a max-min fair flow never does, so no piece times out;
//  - reading the origin is one HTTP request per contiguous run of missing pieces, delivered
//    piece by piece as the stream crosses piece boundaries; the blob's last piece has a request
//    of its own, made first (origin-runs.ts).
//
// Cut-through relay: a peer offers a piece to children (and reports PieceStarted) as soon as its
// bytes start to arrive; a relayed flow goes no faster than the flow feeding it, and its last
// byte waits until the parent has stored the piece, while the child already asks that parent for
// its next piece (stillUploading); a piece given up cuts its relays short.
// What is left out: hashing, disk writes and every other CPU cost (a stored piece is usable at
// once), TCP dynamics beyond max-min fair sharing, HTTP and gRPC overheads beyond one latency
// per message, failures (no parent dies or sends bad data, the scheduler never goes away),
// host keep-alives. The candidates are kept sorted as they change (candidate-buckets.ts) rather
// than sorted on every pump, in the same order.

import type { HostInfo, ParentInfo, PeerPacket, SchedulerPacket } from '../src/rpc/scheduler-api.js';
import type { Peer } from '../src/scheduler/resources.js';
import { pieceTieBreaks, rarityClass } from '../src/peer/swarm/policy/candidate-order.js';
import { chainParentsServe, dropsWithRetiredParent, ENDGAME_AFTER_MS, wantsSecondParent } from '../src/peer/swarm/policy/endgame.js';
import { contiguousRuns, lastPieceFirst } from '../src/peer/swarm/policy/origin-runs.js';
import { bestParentFor, parentIsFree, stillUploading, type ParentChoice, type ParentView } from '../src/peer/swarm/policy/parent-choice.js';
import { ParentPace } from '../src/peer/swarm/policy/parent-pace.js';
import { RETRY_AFTER_FAILED_PIECE_MS, stallVerdict, WATCHDOG_INTERVAL_MS } from '../src/peer/swarm/policy/stall.js';
import type { Scheduling } from '../src/scheduler/scheduling.js';
import { CandidateBuckets } from './candidate-buckets.js';
import type { EventQueue } from './event-queue.js';
import type { Flow, Network, NetHost } from './network.js';

export interface PeerSettings {
  /** Pieces fetched from parents at once for one task (`--piece-parallelism`, default 8). */
  parallelism: number;
  /** Pieces fetched from one parent at once (`perParent`, default 3). */
  perParent: number;
  /** The peer's `stallMs`, in seconds (stall.ts). */
  stall: number;
  /**
   * The peer before its endgame fix: the endgame ran inside pieceStored while the winning
   * attempt was still listed, and asked a second parent for the piece just stored. The
   * emulated measurements that --validate replays were taken with that peer.
   */
  endgameRefetchesStored?: boolean;
  /**
   * The peer before its tail-only endgame: whenever its parents had nothing new for it, every
   * piece on its way for 0.5 s was asked of a second parent (implied by endgameRefetchesStored).
   */
  eagerEndgame?: boolean;
  /**
   * The peer before the cut-through relay (d87501f) and PieceStarted: a piece is offered to
   * children, and its peer to the scheduler, only once it is stored (`--validate` replays
   * measurements of that peer).
   */
  storeAndForward?: boolean;
  /**
   * The peer before 7bbf30d: a blob read from the origin was one request from its first piece
   * to its last (`--validate` replays measurements of that peer).
   */
  originInOrder?: boolean;
  /**
   * Seconds the peer's first piece request takes beyond the latency to reach its parent: a fresh
   * process on a loaded machine. On the emulated cluster, 33 processes starting at once on two
   * cores, each hop of the first chain took 0.2–1.6 s from its request to its PieceStarted, and
   * hops formed a few seconds later 0.05 s. Default 0.
   */
  coldStart?: number;
}

/** The peer daemon defaults of src/peer/config.ts and src/peer/daemon.ts. */
export const defaultPeerSettings = (): PeerSettings => ({ parallelism: 8, perParent: 3, stall: 10 });
export const DEFAULT_UPLOAD_SLOTS = { node: 8, seed: 8 };
/** The seed's upload slots in the emulated runs that --validate replays (the default then). */
export const MEASURED_SEED_UPLOAD_SLOTS = 32;

export interface SimTask {
  id: string;
  size: number;
  pieceSize: number;
  pieceCount: number;
  originUrl: string;
}

export function pieceLength(task: SimTask, index: number): number {
  return Math.max(0, Math.min(task.pieceSize, task.size - index * task.pieceSize));
}

/** Everything the simulated peers share: the clock, the network, the scheduler and the bookkeeping. */
export class World {
  readonly hosts = new Map<string, SimHost>();
  readonly downloads = new Map<string, SimDownload>();
  /** Wall-clock milliseconds spent inside the real scheduler's code, and calls made. */
  schedulerMs = 0;
  schedulerCalls = 0;
  scheduling!: Scheduling;
  readonly bytesBySource = { origin: 0, seed: 0, peer: 0 };
  /** Bytes that arrived at a child more than once (endgame races and the like). */
  duplicateBytes = 0;
  piecesFromParents = 0;
  busyAnswers = 0;
  /** Downloads that hold the whole blob, of seeds and of nodes. */
  readonly completed = { seed: 0, node: 0 };

  constructor(
    readonly queue: EventQueue,
    readonly net: Network,
    readonly registry: NetHost,
    /** Where the scheduler runs (for latencies). */
    readonly schedulerHost: NetHost,
    readonly settings: PeerSettings,
    readonly random: () => number,
  ) {}

  get now(): number {
    return this.queue.now;
  }

  /** Calls into the scheduler, timing the real code. */
  inScheduler<T>(fn: () => T): T {
    const started = performance.now();
    try {
      return fn();
    } finally {
      this.schedulerMs += performance.now() - started;
      this.schedulerCalls++;
    }
  }

  addHost(net: NetHost, info: HostInfo): SimHost {
    const host = new SimHost(this, net, info);
    this.hosts.set(info.id, host);
    this.inScheduler(() => this.scheduling.announceHost(info));
    return host;
  }

  /** The scheduler's seed trigger (HTTP POST to the seed's upload server): the seed fetches the whole task. */
  triggerSeed(hostId: string, task: SimTask): void {
    const host = this.hosts.get(hostId);
    if (!host) throw new Error(`no simulated host ${hostId}`);
    this.queue.after(this.net.latency(this.schedulerHost, host.net), () => {
      const download = host.download(task);
      download.want(0, task.pieceCount - 1);
    });
  }
}

/** A machine: its NIC, its upload server's slots, its tasks. */
export class SimHost {
  readonly tasks = new Map<string, SimDownload>();
  /** Pieces being uploaded right now (the upload server's `inUse`). */
  inUse = 0;
  constructor(
    readonly world: World,
    readonly net: NetHost,
    readonly info: HostInfo,
  ) {}
  get id(): string {
    return this.info.id;
  }
  get seed(): boolean {
    return this.info.seed;
  }
  get slots(): number {
    return this.info.uploadSlots;
  }
  download(task: SimTask): SimDownload {
    let download = this.tasks.get(task.id);
    if (!download) {
      download = new SimDownload(this.world, this, task);
      this.tasks.set(task.id, download);
      this.world.downloads.set(download.peerId, download);
    }
    return download;
  }
}

/** A child's view of one parent (parent-link.ts): the parent's pieces as the bitmap long poll reports them. */
class SimLink implements ParentView {
  /** Pieces the parent offers: stored, or on their way to it (relayed as they arrive). */
  readonly has: Uint8Array;
  /** Pieces the parent has stored, as the child last heard. */
  readonly whole: Uint8Array;
  inflight = 0;
  /** Attempts on this link whose bytes are not all in but the last (stillUploading). */
  uploading = 0;
  readonly pace = new ParentPace();
  /** After a 429, left alone until then (simulated milliseconds). */
  busyUntil = 0;
  closed = false;
  constructor(
    readonly child: SimDownload,
    readonly parent: SimDownload,
    readonly info: ParentInfo,
  ) {
    this.has = new Uint8Array(child.task.pieceCount);
    this.whole = new Uint8Array(child.task.pieceCount);
  }
  get id(): string {
    return this.info.peerId;
  }
  get seed(): boolean {
    return this.info.seed;
  }
  get rate(): number {
    return this.pace.rate;
  }
  get piecesAtOnce(): number | undefined {
    const cap = this.info.piecesAtOnce;
    return cap !== undefined && cap > 0 ? cap : undefined;
  }
  offers(index: number): boolean {
    return this.has[index] === 1;
  }
  holdsWhole(index: number): boolean {
    return this.whole[index] === 1;
  }
  /** The parent offers `index` (`whole`: has stored it); `pump` false when more news comes in the same bitmap answer. */
  add(index: number, whole: boolean, pump = true): void {
    if (this.closed) return;
    if (whole) this.whole[index] = 1;
    if (this.has[index]) return;
    this.has[index] = 1;
    this.child.holderAdded(this, index, pump);
  }
  /** The parent gave up a piece it was receiving (and relaying), or answered 404 for it. */
  remove(index: number): void {
    if (this.closed || !this.has[index]) return;
    this.has[index] = 0;
    this.whole[index] = 0;
    this.child.holderRemoved(this, index);
  }
}

/** A piece arriving at a peer, which it relays to children as it comes (cut-through). */
interface GrowingPiece {
  /** The flow bringing it; relayed flows go no faster. */
  flow: Flow;
  /** The attempt of this peer that brings it. */
  attempt: Attempt;
  /** Cut the relays short (the piece was given up). */
  readonly cuts: Set<() => void>;
  /** Relays whose bytes have all left, holding the last byte until the piece is stored. */
  readonly waiters: Array<() => void>;
}

interface Attempt {
  index: number;
  link: SimLink;
  started: number;
  done: boolean;
  /** Counted in its link's `uploading` (stillUploading). */
  uploading: boolean;
  flow?: Flow;
}

type Mode = 'connecting' | 'swarm' | 'origin';

/** One host's download of (and service for) one task: the real BlobTask plus SwarmDownload. */
export class SimDownload {
  readonly stored: Uint8Array;
  storedCount = 0;
  /** pieces-from-parents.ts fastestServed: the fastest a parent has served this peer. */
  private fastestServed = 0;
  bytesWritten = 0;
  readonly bytesFrom = { origin: 0, seed: 0, peer: 0 };
  /** Children's links following this peer's bitmap. */
  readonly followers = new Set<SimLink>();
  /** Pieces arriving here now, offered to children as they come. */
  readonly growing = new Map<number, GrowingPiece>();
  mode: Mode = 'connecting';
  /** When a pump is due for a busy parent's wait to end (simulated ms; Infinity: none). */
  private backoffWakeAt = Infinity;
  private connected = false;
  /** A piece was asked of a parent already (PeerSettings.coldStart). */
  private askedParent = false;
  private schedPeer?: Peer;
  readonly wanted: Uint8Array;
  wantedCount = 0;
  private readonly digest: Uint8Array;
  private readonly links = new Map<string, SimLink>();
  private nodeLinks = 0;
  private readonly blocked = new Set<string>();
  private readonly attempts = new Map<number, Attempt[]>();
  private readonly originBusy: Uint8Array;
  private lastProgress = 0;
  finished = false;
  finishedAt = Infinity;
  /** A client reads the blob from its start (a whole-blob GET): the head window applies. */
  streaming = false;
  private readonly waiters: Array<{ first: number; last: number; resolve: () => void }> = [];

  /** Per piece, the links offering it, and those of them that are nodes. */
  private readonly holders: Uint8Array;
  private readonly nodeHolders: Uint8Array;
  private readonly candidates: CandidateBuckets;
  private readonly choice: ParentChoice<SimLink>;
  /** Bumped whenever something changes that could let a pump start a piece it could not before. */
  private changes = 0;
  private fruitlessScan = { changes: -1, until: 0 };

  constructor(
    readonly world: World,
    readonly host: SimHost,
    readonly task: SimTask,
  ) {
    const n = task.pieceCount;
    this.stored = new Uint8Array(n);
    this.wanted = new Uint8Array(n);
    this.digest = new Uint8Array(n);
    this.originBusy = new Uint8Array(n);
    this.holders = new Uint8Array(n);
    this.nodeHolders = new Uint8Array(n);
    this.candidates = new CandidateBuckets(pieceTieBreaks(n, world.random));
    this.choice = { now: 0, perParent: world.settings.perParent, hasNodeParents: false, uploading: (link) => link.uploading };
  }

  get peerId(): string {
    return `${this.host.id}|${this.task.id}`;
  }
  get complete(): boolean {
    return this.storedCount === this.task.pieceCount;
  }
  private get now(): number {
    return this.world.now;
  }

  /** Adds pieces [first, last] to fetch (the mirror's task.request → SwarmDownload.want). */
  want(first: number, last: number): void {
    const wasIdle = this.wantedCount === 0;
    let added = false;
    for (let index = first; index <= last; index++) {
      if (!this.stored[index] && !this.wanted[index]) {
        this.wanted[index] = 1;
        this.wantedCount++;
        this.refresh(index);
        added = true;
      }
    }
    if (added && wasIdle) this.lastProgress = this.now;
    if (this.mode === 'connecting' && !this.connected) this.connect();
    if (this.mode === 'origin') this.fetchFromOrigin();
    else this.pump();
  }

  /** Resolves (calls back) when every piece of [first, last] is stored. */
  whenStored(first: number, last: number, resolve: () => void): void {
    if (this.runStored(first, last)) return resolve();
    this.waiters.push({ first, last, resolve });
  }

  // ---- the scheduler stream

  private connect(): void {
    this.connected = true;
    const request = {
      peerId: this.peerId,
      hostId: this.host.id,
      taskId: this.task.id,
      contentLength: this.task.size,
      pieceSize: this.task.pieceSize,
      origin: { url: this.task.originUrl, headers: {}, public: true },
      heldPieces: [] as number[],
    };
    for (let i = 0; i < this.task.pieceCount; i++) if (this.stored[i]) request.heldPieces.push(i);
    const world = this.world;
    const latency = world.net.latency(this.host.net, world.schedulerHost);
    world.queue.after(latency, () => {
      this.schedPeer = world.inScheduler(() =>
        world.scheduling.register(request, (packet) => world.queue.after(latency, () => this.onPacket(packet))),
      );
    });
    this.scheduleWatchdog();
  }

  private report(packet: PeerPacket): void {
    const world = this.world;
    world.queue.after(world.net.latency(this.host.net, world.schedulerHost), () => {
      const peer = this.schedPeer;
      if (!peer) return;
      world.inScheduler(() => {
        switch (packet.packet) {
          case 'pieceStarted':
            return world.scheduling.pieceStarted(peer, packet.pieceStarted.index, { parentId: packet.pieceStarted.parentId });
          case 'pieceFinished':
            return world.scheduling.pieceFinished(peer, packet.pieceFinished);
          case 'pieceFailed':
            return world.scheduling.pieceFailed(peer, packet.pieceFailed);
          case 'reschedule':
            return world.scheduling.reschedule(peer, packet.reschedule.blocklist ?? []);
          case 'downloadFinished':
            return world.scheduling.finished(peer);
          default:
            return undefined;
        }
      });
    });
  }

  private onPacket(packet: SchedulerPacket): void {
    switch (packet.packet) {
      case 'digests':
        for (const key of Object.keys(packet.digests.digests ?? {})) {
          const index = Number(key);
          if (!this.digest[index]) {
            this.digest[index] = 1;
            this.refresh(index);
          }
        }
        break;
      case 'parents':
        if (this.mode === 'connecting') this.mode = 'swarm';
        this.setParents(packet.parents.parents ?? []);
        break;
      case 'wait':
        if (this.mode === 'connecting') this.mode = 'swarm';
        break;
      case 'backToSource':
        this.goToOrigin();
        return;
    }
    this.pump();
  }

  private setParents(parents: ParentInfo[]): void {
    const keep = new Set(parents.map((p) => p.peerId));
    for (const [id, link] of this.links) if (!keep.has(id)) this.retireLink(link);
    for (const info of parents) {
      if (this.links.has(info.peerId) || this.blocked.has(info.peerId) || info.hostId === this.host.id) continue;
      const parent = this.world.downloads.get(info.peerId);
      if (!parent) throw new Error(`scheduler named unknown parent ${info.peerId}`);
      const link = new SimLink(this, parent, info);
      this.links.set(info.peerId, link);
      if (!link.seed) this.nodeLinks++;
      this.changes++;
      this.followParent(link);
    }
  }

  /**
   * The bitmap long poll: the first request reaches the parent one latency later and answers
   * with everything it holds then; from then on each new piece is reported one latency after
   * the parent stored it.
   */
  private followParent(link: SimLink): void {
    const world = this.world;
    const latency = world.net.latency(this.host.net, link.parent.host.net);
    world.queue.after(latency, () => {
      if (link.closed) return;
      const parent = link.parent;
      const snapshot: Array<{ index: number; whole: boolean }> = [];
      for (let i = 0; i < parent.task.pieceCount; i++) {
        const whole = parent.stored[i] === 1;
        if (whole || parent.growing.has(i)) snapshot.push({ index: i, whole });
      }
      parent.followers.add(link);
      world.queue.after(latency, () => {
        // One bitmap answer: the child pumps once, having seen all of it (ParentLink.onUpdate).
        for (const { index, whole } of snapshot) link.add(index, whole, false);
        if (!link.closed && snapshot.length) this.pump();
      });
    });
  }

  /**
   * parent-set.ts follow(): a parent no longer named retires; its pieces on the way finish,
   * unless one arrives far slower than it served before (dropsWithRetiredParent).
   */
  private retireLink(link: SimLink): void {
    this.closeLink(link);
    this.giveUpRetiredStragglers();
  }

  /** pieces-from-parents.ts retiredStragglers(): pieces from replaced parents that come far slower than expected are given up. */
  private giveUpRetiredStragglers(): void {
    for (const attempts of [...this.attempts.values()]) {
      for (const attempt of attempts) {
        if (!attempt.link.closed || attempt.done || !attempt.flow) continue;
        const progress = {
          receivedBytes: this.world.net.delivered(attempt.flow),
          elapsedMs: (this.now - attempt.started) * 1000,
          length: pieceLength(this.task, attempt.index),
        };
        if (dropsWithRetiredParent(progress, attempt.link.rate, chainParentsServe(this.links.values(), attempt.index))) this.abort(attempt);
      }
    }
  }

  private closeLink(link: SimLink): void {
    link.closed = true;
    this.links.delete(link.id);
    link.parent.followers.delete(link);
    if (!link.seed) this.nodeLinks--;
    for (let i = 0; i < link.has.length; i++) if (link.has[i]) this.countHolder(link, i, -1);
    this.changes++;
  }

  /** A link learned that its parent no longer offers `index`. */
  holderRemoved(link: SimLink, index: number): void {
    this.countHolder(link, index, -1);
    this.changes++;
  }

  /** A link learned that its parent offers `index`. */
  holderAdded(link: SimLink, index: number, pump: boolean): void {
    this.countHolder(link, index, 1);
    if (this.candidates.has(index) && this.linkFree(link)) this.changes++;
    if (pump) this.pump();
  }

  private countHolder(link: SimLink, index: number, delta: 1 | -1): void {
    this.holders[index] = (this.holders[index] ?? 0) + delta;
    if (!link.seed) this.nodeHolders[index] = (this.nodeHolders[index] ?? 0) + delta;
    this.refresh(index);
  }

  // ---- candidate bookkeeping

  /** A wanted piece not stored nor on its way, whose digest the scheduler vouched for, that some parent offers. */
  private isCandidate(index: number): boolean {
    return (
      this.wanted[index] === 1 &&
      !this.stored[index] &&
      !this.attempts.has(index) &&
      this.digest[index] === 1 &&
      (this.holders[index] ?? 0) > 0
    );
  }

  /** Files a piece under the rarity class its state calls for (or takes it out of the candidates). */
  private refresh(index: number): void {
    const rarity = this.isCandidate(index) ? rarityClass(this.holders[index] ?? 0, this.nodeHolders[index] ?? 0) : undefined;
    if (this.candidates.set(index, rarity)) this.changes++;
  }

  private parentChoice(): ParentChoice<SimLink> {
    this.choice.now = this.now * 1000;
    this.choice.hasNodeParents = this.nodeLinks > 0;
    return this.choice;
  }

  private linkFree(link: SimLink): boolean {
    return parentIsFree(link, this.parentChoice());
  }

  // ---- fetching from parents

  /** swarm-download.ts pump(): fills the free fetch slots in the policy's order; the endgame at the tail. */
  pump(): void {
    if (this.mode !== 'swarm' || this.finished) return;
    const hadCandidates = this.candidates.size > 0;
    let budget = this.world.settings.parallelism - this.attempts.size;
    if (budget > 0 && hadCandidates && !this.skipScan() && this.anyFreeLink()) {
      let started = 0;
      this.candidates.visit(this.streaming, (index) => {
        if (!this.candidates.has(index)) return true; // started already (a head window piece)
        const link = this.bestLinkFor(index);
        if (link) {
          this.startAttempt(index, link);
          started++;
          budget--;
        }
        return budget > 0 && this.anyFreeLink();
      });
      if (started === 0) this.noteFruitlessScan();
    }
    if (budget > 0 && hadCandidates) this.pumpWhenBackoffEnds();
    if (!hadCandidates && this.attempts.size > 0) this.endgame();
  }

  /** pieces-from-parents.ts pumpWhenBackoffEnds(): a busy parent's wait ends without news; pump then. */
  private pumpWhenBackoffEnds(): void {
    const now = this.now * 1000;
    let until = Infinity;
    for (const link of this.links.values()) if (link.busyUntil > now) until = Math.min(until, link.busyUntil);
    if (until === Infinity || this.backoffWakeAt <= until) return;
    this.backoffWakeAt = until;
    // A nanosecond past the wait: the clock's seconds times 1000 may fall an ulp short of `until`.
    this.world.queue.at(until / 1000 + 1e-9, () => {
      if (this.backoffWakeAt !== until) return; // an earlier wake replaced this one
      this.backoffWakeAt = Infinity;
      this.pump();
    });
  }

  /** A scan that found nothing startable need not be repeated until something relevant changes. */
  private skipScan(): boolean {
    return this.fruitlessScan.changes === this.changes && this.now < this.fruitlessScan.until;
  }

  private noteFruitlessScan(): void {
    let until = Infinity;
    for (const link of this.links.values()) if (link.busyUntil > this.now * 1000) until = Math.min(until, link.busyUntil / 1000);
    this.fruitlessScan = { changes: this.changes, until };
  }

  private anyFreeLink(): boolean {
    for (const link of this.links.values()) if (this.linkFree(link)) return true;
    return false;
  }

  private bestLinkFor(index: number, except?: SimLink): SimLink | undefined {
    return bestParentFor(index, this.links.values(), this.parentChoice(), except);
  }

  /**
   * swarm-download.ts endgame(): at the tail (every wanted piece stored or on its way), a piece
   * arriving ENDGAME_SLOWER times slower than another parent's measured rate is asked of that
   * parent too (`wantsSecondParent`, the real peer's rule). The peer before that rule
   * (`eagerEndgame`) doubled every piece on its way for 0.5 s whenever its parents had nothing
   * new for it.
   */
  private endgame(): void {
    const { eagerEndgame, endgameRefetchesStored } = this.world.settings;
    const eager = eagerEndgame || endgameRefetchesStored;
    if (!eager) for (let i = 0; i < this.task.pieceCount; i++) if (this.wanted[i] && !this.stored[i] && !this.attempts.has(i)) return;
    for (const [index, attempts] of this.attempts) {
      const first = attempts[0];
      if (!first || attempts.length !== 1) continue;
      if (!endgameRefetchesStored && this.stored[index]) continue;
      const link = this.bestLinkFor(index, first.link);
      if (!link) continue;
      const elapsedMs = (this.now - first.started) * 1000;
      const straggles = eager
        ? elapsedMs >= ENDGAME_AFTER_MS
        : wantsSecondParent(
            { receivedBytes: first.flow ? this.world.net.delivered(first.flow) : 0, elapsedMs },
            link.rate,
            this.fastestServed,
          );
      if (straggles) this.startAttempt(index, link);
    }
  }

  private startAttempt(index: number, link: SimLink): void {
    const world = this.world;
    const attempt: Attempt = { index, link, started: this.now, done: false, uploading: true };
    const list = this.attempts.get(index);
    if (list) list.push(attempt);
    else this.attempts.set(index, [attempt]);
    link.inflight++;
    link.uploading++;
    this.refresh(index);
    const latency = world.net.latency(this.host.net, link.parent.host.net);
    const length = pieceLength(this.task, index);
    const coldStart = this.askedParent ? 0 : (world.settings.coldStart ?? 0);
    this.askedParent = true;
    // The request reaches the parent's upload server.
    world.queue.after(latency + coldStart, () => {
      if (attempt.done) return;
      const parent = link.parent;
      const server = parent.host;
      // Not stored: relayed as it arrives if it is on its way there (upload/server.ts relayGrowing).
      const relayed = parent.stored[index] ? undefined : parent.growing.get(index);
      if (!parent.stored[index] && !relayed) {
        world.queue.after(latency, () => {
          if (attempt.done) return;
          link.remove(index); // parent-link.ts forgets a piece the parent answered 404 for
          this.finishAttempt(attempt);
          this.report({
            packet: 'pieceFailed',
            pieceFailed: { index, parentId: link.id, reason: 'FAILURE_REASON_PIECE_MISSING', message: 'missing' },
          });
        });
        return;
      }
      if (server.inUse >= server.slots) {
        world.busyAnswers++;
        world.queue.after(latency, () => {
          if (attempt.done) return;
          // parent-link.ts fetchPiece(): the parent is left alone for about one of its piece times.
          link.busyUntil = this.now * 1000 + link.pace.answeredBusy();
          this.finishAttempt(attempt);
        });
        return;
      }
      server.inUse++;
      const arrive = () => world.queue.after(latency, () => this.pieceArrived(attempt, length));
      attempt.flow = world.net.start(
        server.net,
        this.host.net,
        length,
        () => {
          attempt.flow = undefined;
          server.inUse--;
          // A relay's last byte waits for the parent to store the piece; the rest is in, so the
          // parent counts as free for the next piece already (stillUploading).
          if (relayed && !parent.stored[index]) {
            relayed.waiters.push(arrive);
            this.allButLastByteIn(attempt, length);
          } else arrive();
        },
        relayed?.flow,
      );
      this.beginGrowing(index, attempt);
      if (relayed) {
        relayed.cuts.add(() => {
          if (attempt.done) return;
          this.stopFlow(attempt);
          world.queue.after(latency, () => this.finishAttempt(attempt));
        });
      }
    });
  }

  /** swarm-download.ts: `growing.next(length - 2).then(pump)`: the link is free for the next piece. */
  private allButLastByteIn(attempt: Attempt, length: number): void {
    if (attempt.done || !attempt.uploading || stillUploading(length - 1, length)) return;
    attempt.uploading = false;
    attempt.link.uploading--;
    this.changes++;
    this.pump();
  }

  /**
   * A piece's bytes start to arrive here: offer it to children, who may fetch it relayed, and
   * tell the scheduler (PieceStarted), which may hand this peer out as a parent at once.
   */
  private beginGrowing(index: number, attempt: Attempt): void {
    if (this.world.settings.storeAndForward || this.stored[index] || this.growing.has(index) || !attempt.flow) return;
    this.growing.set(index, { flow: attempt.flow, attempt, cuts: new Set(), waiters: [] });
    this.report({ packet: 'pieceStarted', pieceStarted: { index, parentId: attempt.link.id } });
    this.tellFollowers((link) => link.add(index, false));
  }

  /** The attempt bringing a growing piece ended without storing it: cut the relays short. */
  private abandonGrowing(attempt: Attempt): void {
    const growing = this.growing.get(attempt.index);
    if (!growing || growing.attempt !== attempt || this.stored[attempt.index]) return;
    this.growing.delete(attempt.index);
    for (const cut of growing.cuts) cut();
    this.tellFollowers((link) => {
      if (!this.stored[attempt.index] && !this.growing.has(attempt.index)) link.remove(attempt.index);
    });
  }

  /** Children following this peer's bitmap hear news one latency later. */
  private tellFollowers(news: (link: SimLink) => void): void {
    for (const link of this.followers) this.world.queue.after(this.world.net.latency(this.host.net, link.child.host.net), () => news(link));
  }

  private pieceArrived(attempt: Attempt, length: number): void {
    if (attempt.done) return;
    const { link, index } = attempt;
    const elapsedMs = Math.max(1, (this.now - attempt.started) * 1000);
    link.pace.pieceServed(length, elapsedMs);
    this.fastestServed = Math.max(this.fastestServed, link.pace.rate);
    this.world.piecesFromParents++;
    // The first good copy wins; the other endgame attempts are aborted.
    for (const other of [...(this.attempts.get(index) ?? [])]) if (other !== attempt) this.abort(other);
    if (this.stored[index]) this.world.duplicateBytes += length;
    this.storePiece(index, link.seed ? 'seed' : 'peer', link.id, elapsedMs);
    this.finishAttempt(attempt, true);
  }

  private abort(attempt: Attempt): void {
    if (attempt.done) return;
    this.stopFlow(attempt);
    this.finishAttempt(attempt);
  }

  /** Cancels an attempt's transfer, freeing the parent's upload slot. */
  private stopFlow(attempt: Attempt): void {
    if (!attempt.flow) return;
    this.world.net.cancel(attempt.flow);
    attempt.flow = undefined;
    attempt.link.parent.host.inUse--;
  }

  /** `stored`: the attempt brought its piece, and the peer asks for the next one at once. */
  private finishAttempt(attempt: Attempt, stored = false): void {
    if (attempt.done) return;
    attempt.done = true;
    this.abandonGrowing(attempt);
    attempt.link.inflight--;
    if (attempt.uploading) attempt.link.uploading--;
    const list = this.attempts.get(attempt.index);
    if (list) {
      const remaining = list.filter((a) => a !== attempt);
      if (remaining.length) this.attempts.set(attempt.index, remaining);
      else {
        this.attempts.delete(attempt.index);
        this.refresh(attempt.index);
      }
    }
    this.changes++;
    // swarm-download.ts: sent to the origin meanwhile, the origin reads skipped this piece while it was on its way.
    if (this.mode === 'origin') return this.fetchFromOrigin();
    if (stored) this.pump();
    else this.world.queue.after(RETRY_AFTER_FAILED_PIECE_MS / 1000, () => this.pump());
  }

  // ---- storing

  private storePiece(index: number, from: 'origin' | 'seed' | 'peer', parentId: string, costMs: number): void {
    if (this.stored[index]) return;
    const world = this.world;
    const length = pieceLength(this.task, index);
    this.stored[index] = 1;
    this.storedCount++;
    const growing = this.growing.get(index);
    if (growing) {
      this.growing.delete(index);
      for (const wake of growing.waiters) wake();
    }
    this.bytesWritten += length;
    this.bytesFrom[from] += length;
    world.bytesBySource[from] += length;
    this.refresh(index);
    this.tellFollowers((link) => link.add(index, true));
    // SwarmDownload.pieceStored
    if (this.wanted[index]) {
      this.wanted[index] = 0;
      this.wantedCount--;
    }
    this.lastProgress = this.now;
    this.report({
      packet: 'pieceFinished',
      pieceFinished: {
        index,
        digest: from === 'origin' ? pieceDigest(this.task, index) : '',
        parentId,
        costMs: Math.round(costMs),
        fromOrigin: from === 'origin',
        length,
      },
    });
    for (const waiter of [...this.waiters]) {
      if (this.runStored(waiter.first, waiter.last)) {
        this.waiters.splice(this.waiters.indexOf(waiter), 1);
        waiter.resolve();
      }
    }
    // The peers the old-endgame flags replay also asked for pieces when the task stored one,
    // while the attempt that brought it was still listed: that is how their endgame asked a
    // second parent for a piece just stored. Today's peer refills its slots only as attempts end.
    const { eagerEndgame, endgameRefetchesStored } = this.world.settings;
    if (eagerEndgame || endgameRefetchesStored) this.pump();
    if (this.complete && !this.finished) this.completed();
  }

  /** The whole blob is stored (and, in the real peer, verified): say so, stay on as a holder. */
  private completed(): void {
    this.finished = true;
    this.finishedAt = this.now;
    this.world.completed[this.host.seed ? 'seed' : 'node']++;
    this.report({ packet: 'downloadFinished', downloadFinished: {} });
    for (const link of [...this.links.values()]) this.closeLink(link);
  }

  private runStored(first: number, last: number): boolean {
    for (let i = first; i <= last; i++) if (!this.stored[i]) return false;
    return true;
  }

  // ---- the watchdog

  private scheduleWatchdog(): void {
    this.world.queue.after(WATCHDOG_INTERVAL_MS / 1000, () => {
      if (this.finished) return;
      this.checkProgress();
      this.scheduleWatchdog();
    });
  }

  private checkProgress(): void {
    if (this.finished || this.mode === 'origin' || this.wantedCount === 0) return;
    this.giveUpRetiredStragglers();
    this.pump();
    const verdict = stallVerdict((this.now - this.lastProgress) * 1000, this.world.settings.stall * 1000, this.attempts.size);
    if (verdict === 'origin') this.goToOrigin();
    else if (verdict === 'reschedule') this.report({ packet: 'reschedule', reschedule: { blocklist: [...this.blocked] } });
  }

  // ---- the origin

  private goToOrigin(): void {
    this.mode = 'origin';
    this.fetchFromOrigin();
  }

  /** Reads every wanted piece not yet stored or on its way, in contiguous runs, from the origin. */
  private fetchFromOrigin(): void {
    const missing: number[] = [];
    for (let i = 0; i < this.task.pieceCount; i++)
      if (this.wanted[i] && !this.stored[i] && !this.originBusy[i] && !this.attempts.has(i)) missing.push(i);
    const runs = contiguousRuns(missing);
    // swarm-download.ts fetchFromOrigin() (originRuns): the blob's last piece (a lazy puller's TOC) first.
    for (const run of this.world.settings.originInOrder ? runs : lastPieceFirst(runs, this.task.pieceCount)) {
      for (let i = run.first; i <= run.last; i++) this.originBusy[i] = 1;
      this.readOriginRun(run.first, run.last);
    }
  }

  /** One (Range) GET to the registry, cut into pieces as the stream arrives. */
  private readOriginRun(first: number, last: number): void {
    const world = this.world;
    const registry = world.registry;
    const latency = world.net.latency(this.host.net, registry);
    let index = first;
    const runEnded = () => {
      for (let i = first; i <= last; i++) this.originBusy[i] = 0;
      let missing = false;
      for (let i = 0; i < this.task.pieceCount && !missing; i++) if (this.wanted[i] && !this.stored[i]) missing = true;
      if (missing) this.goToOrigin();
    };
    world.queue.after(latency, () => {
      world.net.start(registry, this.host.net, pieceLength(this.task, index), (flow) => {
        const arrived = index;
        world.queue.after(latency, () => this.storePiece(arrived, 'origin', '', 0));
        if (index < last) {
          index++;
          world.net.extend(flow, pieceLength(this.task, index));
        } else {
          world.queue.after(latency, runEnded);
        }
      });
    });
  }
}

/** A stand-in piece digest in the form the scheduler checks (the simulator moves no bytes). */
export function pieceDigest(task: SimTask, index: number): string {
  const hex = (task.id.slice(-32) + index.toString(16).padStart(32, '0')).slice(-64);
  return `sha256:${hex.padStart(64, '0')}`;
}
