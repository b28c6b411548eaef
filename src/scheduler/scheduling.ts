import type { Logger } from '../common/log.js';
import type {
  HostInfo,
  ParentInfo,
  PieceDigests,
  PieceFailed,
  PieceFinished,
  RegisterPeer,
  SchedulerPacket,
  TaskStat,
} from '../rpc/scheduler-api.js';
import type { SchedulingConfig } from './config.js';
import { Adaptation } from './adaptive.js';
import { OnDemandReading } from './on-demand-reading.js';
import { descendantsOf, Peer, Resources, type Host, type Task } from './resources.js';
import { filterCandidates, freeChildSlots, keepsItsParents, momentarilyOut, selectParents, type Exclusion } from './selection.js';

/** How long a triggered seed may take to register for the task before others stop waiting for it. */
const SEED_SHOW_UP_MS = 15_000;
/** Waiting peers tried beyond a new holder's free slots, for those that cannot take it. */
const SPARE_TRIES = 8;

/** What the scheduling engine needs from the outside world; the simulator provides its own. */
export interface SchedulingHooks {
  now(): number;
  /** Ask a seed host to fetch a task from its origin. */
  triggerSeed(seed: Host, task: Task): Promise<void>;
  onScheduled?(peer: Peer, outcome: 'parents' | 'wait' | 'backToSource', latencyMs: number): void;
  onBytes?(task: Task, source: 'peer' | 'seed' | 'origin', bytes: number): void;
}

/**
 * The scheduling engine: registers peers on tasks, chooses their parents, decides who reads
 * the origin and when to trigger a seed, and spreads trusted piece digests. It holds no
 * transport: packets go out through each peer's `send`.
 */
export class Scheduling {
  /** The adaptive shape's measurements and moves. */
  private readonly adaptive: Adaptation;
  /** Which registries' swarms fetch pieces workloads wait for (SwarmReading). */
  private readonly onDemand = new OnDemandReading();

  constructor(
    readonly resources: Resources,
    public config: SchedulingConfig,
    private readonly hooks: SchedulingHooks,
    private readonly log: Logger,
  ) {
    this.adaptive = new Adaptation({
      resources,
      log,
      reschedule: (peer) => this.schedule(peer),
      moveTo: (peer, parent) => this.setParents(peer, [parent]),
      mayServe: (child, parent) => {
        const excluded = new Map<string, Exclusion>();
        if (filterCandidates(child, this.config, this.hooks.now(), excluded).includes(parent)) return true;
        const why = excluded.get(parent.id);
        // Full, or a chain's steady state: a child as far as its parent has nothing new from it for now.
        return why === 'overloaded' || (why === 'nothing-to-offer' && momentarilyOut(parent, why) && !descendantsOf(child).has(parent));
      },
    });
  }

  announceHost(info: HostInfo): Host {
    return this.resources.upsertHost(info, this.hooks.now());
  }

  /** Drops hosts silent for longer than `timeoutMs`, with their peers. */
  /**
   * Drops hosts silent for `timeoutMs`. Their peers' streams are ended: a host that was only slow
   * (a paused process, announcements past their deadline) announces itself again and its peers
   * register again, rather than keep reporting on streams the scheduler no longer reads.
   */
  expireHosts(timeoutMs: number): Host[] {
    const now = this.hooks.now();
    const expired = [...this.resources.hosts.values()].filter((host) => now - host.lastSeen > timeoutMs);
    for (const host of expired) {
      const peers = [...host.peers];
      this.removeHost(host);
      for (const peer of peers) peer.disconnect(`host ${host.id} sent no keep-alive for ${timeoutMs} ms; announce it again`);
    }
    return expired;
  }

  removeHost(host: Host): void {
    for (const peer of [...host.peers]) this.leave(peer);
    this.resources.hosts.delete(host.id);
  }

  register(request: RegisterPeer, send: (packet: SchedulerPacket) => void, disconnect?: (reason: string) => void): Peer {
    const host = this.resources.hosts.get(request.hostId);
    if (!host) throw new Error(`host ${request.hostId} has not announced itself`);
    if (!request.taskId) throw new Error('register names no task');
    if (!(request.contentLength >= 0) || !(request.pieceSize > 0)) throw new Error('register has no usable size or piece size');
    const now = this.hooks.now();
    const task = this.resources.task(request.taskId, request.contentLength, request.pieceSize, now, originRegistry(request.origin?.url));
    if (task.contentLength !== request.contentLength || task.pieceSize !== request.pieceSize) {
      throw new Error(
        `task ${task.id} is known with size ${task.contentLength}/${task.pieceSize}, not ${request.contentLength}/${request.pieceSize}`,
      );
    }
    if (request.origin?.url) task.origin = { url: request.origin.url, public: Boolean(request.origin.public) };
    const previous = task.peers.get(request.peerId);
    if (previous) this.leave(previous);
    const peer = new Peer(request.peerId, host, task, send, now, disconnect);
    for (const index of request.heldPieces ?? []) if (index >= 0 && index < task.pieceCount) peer.pieces.add(index);
    task.peers.set(peer.id, peer);
    host.peers.add(peer);
    task.lastActive = now;
    this.sendKnownDigests(task, send);
    if (this.onDemand.reading(task.registry)) send({ packet: 'swarmReading', swarmReading: { onDemand: true } });
    this.schedule(peer);
    return peer;
  }

  /** A peer of the registry's tasks is receiving a piece a workload waits for (forgetting starts that went stale). */
  private awaitedPieceArriving(registry: string, now: number): boolean {
    for (const task of this.resources.tasks.values()) {
      if (task.registry !== registry) continue;
      for (const peer of task.peers.values()) {
        if (peer.awaitedArriving.size === 0) continue;
        peer.forgetStaleStarts(now);
        if (peer.awaitedArriving.size > 0) return true;
      }
    }
    return false;
  }

  /** Tells every peer of the registry's tasks whether its swarm fetches pieces workloads wait for (on-demand-reading.ts). */
  private sayReading(registry: string, onDemand: boolean): void {
    for (const task of this.resources.tasks.values()) {
      if (task.registry !== registry) continue;
      for (const peer of task.peers.values()) if (peer.state !== 'left') peer.send({ packet: 'swarmReading', swarmReading: { onDemand } });
    }
  }

  /**
   * Decides what a peer does next: fetch from parents, read the origin, or wait. A counted
   * round (the periodic pass, or the peer asking) that finds no parent brings the peer closer
   * to being sent to the origin whatever the back-to-source limit.
   */
  schedule(peer: Peer, countRound = false): void {
    if (peer.state === 'left' || peer.state === 'backToSource' || peer.isFinished || peer.idle) return;
    const started = this.hooks.now();
    const task = peer.task;
    if (peer.isSeed && this.mayReadOrigin(task, peer)) return this.sendToOrigin(peer, 'seed peer');
    // Parents are of no use for pieces nobody has vouched for: make sure someone reads the origin.
    if (task.digests.size < task.pieceCount && !this.hasActiveSource(task, () => true)) {
      if (this.triggerSeedFor(peer, started)) return;
      if (this.mayReadOrigin(task, peer)) return this.sendToOrigin(peer, 'no peer is reading the origin');
    }
    const excluded = new Map<string, Exclusion>();
    const parents = selectParents(peer, this.config, started, excluded);
    if (parents.length > 0) {
      this.setParents(peer, parents);
      peer.fruitlessRounds = 0;
      this.hooks.onScheduled?.(peer, 'parents', this.hooks.now() - started);
      return;
    }
    this.setParents(peer, []);
    // A round is fruitless when no peer could serve this one, not when those that could are full
    // (or are below it in the parent graph): they free up as their children finish, which with
    // large pieces or slow links takes many rounds, and sending the waiting peers to the origin
    // meanwhile would be the very registry storm the swarm exists to prevent.
    const holdersBusy = [...excluded.values()].some((why) => why === 'overloaded' || why === 'cycle');
    if (countRound && !holdersBusy) peer.fruitlessRounds++;
    if (peer.fruitlessRounds >= this.config.retryLimit) return this.sendToOrigin(peer, `no parent after ${this.config.retryLimit} rounds`);
    if (this.triggerSeedFor(peer, started)) return;
    if (holdersBusy) {
      if (this.log.isLevelEnabled('debug'))
        this.log.debug({ task: task.id, peer: peer.id, excluded: Object.fromEntries(excluded) }, 'every holder is busy: the peer waits');
      return this.wait(peer, 'every holder is serving as many children as it can', started);
    }
    if (this.hasActiveSource(task, () => true)) return this.wait(peer, 'parents are still fetching their first pieces', started);
    if (this.mayReadOrigin(task, peer)) return this.sendToOrigin(peer, 'no peer holds the blob');
    return this.wait(peer, 'another peer is reading the origin', started);
  }

  /** Triggers the best seed for this child's task, if one should be; the child then waits for it. */
  private triggerSeedFor(peer: Peer, started: number): boolean {
    const task = peer.task;
    const seed = this.pickSeed(peer);
    if (!seed) return false;
    const trigger = { at: started, failed: false };
    task.triggeredSeeds.set(seed.id, trigger);
    this.log.info({ task: task.id, seed: seed.id }, 'triggering seed peer');
    this.hooks.triggerSeed(seed, task).catch((error: Error) => {
      trigger.failed = true;
      this.log.warn({ task: task.id, seed: seed.id, err: error.message }, 'seed trigger failed');
      // The seed is out of the picture for this task: someone else must read the origin.
      for (const waiting of task.peers.values()) if (waiting.state === 'waiting' || waiting.state === 'running') this.schedule(waiting);
    });
    this.wait(peer, `seed ${seed.id} is fetching the blob`, started);
    return true;
  }

  /**
   * A piece began arriving at the peer. It relays such bytes to children as they come, so peers
   * waiting for a parent may get it now rather than once it has stored a whole piece (with 4 MiB
   * pieces on slow links, many seconds later).
   */
  /** The peer reads part of a piece a workload waits for: the registry's swarm reads on demand. */
  spanRead(peer: Peer): void {
    const registry = peer.task.registry;
    if (this.onDemand.demanded(registry, this.hooks.now())) this.sayReading(registry, true);
  }

  /**
   * Piece `index` began arriving at the peer: from `parentId` (absent: the origin); `background`:
   * no workload waits for it.
   */
  pieceStarted(peer: Peer, index: number, how: { background?: boolean; parentId?: string } = {}): void {
    const task = peer.task;
    if (!Number.isInteger(index) || index < 0 || index >= task.pieceCount || peer.pieces.has(index)) return;
    if (!how.background && this.onDemand.demanded(task.registry, this.hooks.now())) this.sayReading(task.registry, true);
    const wasHolder = peer.pieces.size > 0 || peer.growing.size > 0;
    peer.pieceArriving(index, this.hooks.now(), !how.background, how.parentId);
    if (wasHolder) return;
    // A new holder: peers waiting for a parent may take it.
    this.offerNewHolder(peer);
  }

  /**
   * Peers waiting for a parent may take a new holder. Waiting peers are scheduled until as many
   * took it as it has room for, or a few more than that were tried (some cannot take it: it is
   * below them, or across a strict topology key); the periodic pass sees to the rest. With a
   * thousand peers waiting, each new holder must not cost a thousand selections.
   */
  private offerNewHolder(holder: Peer): void {
    let room = freeChildSlots(holder, this.config);
    let tries = room + SPARE_TRIES;
    for (const other of holder.task.peers.values()) {
      if (room <= 0 || tries <= 0) break;
      if (other === holder || other.state !== 'waiting') continue;
      this.schedule(other);
      tries--;
      if (other.parents.includes(holder)) room--;
    }
  }

  pieceFinished(peer: Peer, report: PieceFinished): void {
    const task = peer.task;
    if (report.index < 0 || report.index >= task.pieceCount) return;
    const isNew = !peer.pieces.has(report.index);
    const startedAt = peer.growing.get(report.index);
    peer.pieceStored(report.index);
    task.lastActive = this.hooks.now();
    const length = report.length > 0 ? report.length : task.pieceSize;
    const wellFormed = DIGEST.test(report.digest);
    if (report.fromOrigin) {
      if (isNew) {
        task.bytes.origin += length;
        this.hooks.onBytes?.(task, 'origin', length);
      }
      // Only a peer the scheduler sent to the origin is believed about piece digests.
      if (peer.state === 'backToSource' && wellFormed) this.learnDigest(task, report.index, report.digest);
    } else if (report.parentId) {
      const parent = task.peers.get(report.parentId);
      const source = parent?.isSeed ? 'seed' : 'peer';
      if (isNew) {
        task.bytes[source] += length;
        this.hooks.onBytes?.(task, source, length);
      }
      if (parent) {
        parent.recordCost(report.costMs, length);
        peer.bytesByParentHost.set(parent.host.id, (peer.bytesByParentHost.get(parent.host.id) ?? 0) + length);
      }
    }
    if (wellFormed) {
      peer.reportedDigests.add(report.index);
      if (task.digests.get(report.index) !== report.digest) peer.ownDigests.set(report.index, report.digest);
    }
    if (this.config.shape === 'adaptive') this.adaptive.stored(peer, report, length, startedAt, this.hooks.now());
    // A first holder appeared: peers waiting for one can now be given a parent.
    if (peer.pieces.size === 1) this.offerNewHolder(peer);
  }

  pieceFailed(peer: Peer, report: PieceFailed): void {
    const parent = report.parentId ? peer.task.peers.get(report.parentId) : undefined;
    if (!parent) return;
    parent.failuresAsParent.push(this.hooks.now());
    if (report.reason !== 'FAILURE_REASON_PARENT_SLOW' && report.reason !== 'FAILURE_REASON_PIECE_MISSING') {
      peer.blocklist.add(parent.id);
      this.log.warn(
        { task: peer.task.id, child: peer.id, parent: parent.id, reason: report.reason, message: report.message },
        'parent blocklisted for child',
      );
    }
    if (report.reason !== 'FAILURE_REASON_PIECE_MISSING') this.schedule(peer);
  }

  reschedule(peer: Peer, blocklist: string[]): void {
    for (const id of blocklist) peer.blocklist.add(id);
    // An idle peer asking again wants pieces now: that is no fruitless round.
    const wasIdle = peer.idle;
    peer.idle = false;
    if (peer.state === 'running' || peer.state === 'waiting') this.schedule(peer, !wasIdle);
  }

  /**
   * The peer wants nothing for now. A lazy reader never finishes its task, so without this it
   * would keep its parents, and their hosts' upload slots, for good: measured end to end (8 nodes
   * starting a 4-layer image lazily), the seed's 8 slots went to the first children, which then
   * needed nothing more, and the other nodes waited 60 s for a parent before reading the origin.
   */
  idle(peer: Peer): void {
    if (peer.state !== 'running' && peer.state !== 'waiting') return;
    peer.idle = true;
    const released = peer.parents;
    this.setParents(peer, []);
    peer.state = 'waiting';
    // Their freed slots may serve peers waiting for a parent, on any task of those hosts.
    for (const host of new Set(released.map((parent) => parent.host))) {
      for (const holder of host.peers) this.offerNewHolder(holder);
    }
  }

  finished(peer: Peer): void {
    for (let index = 0; index < peer.task.pieceCount; index++) peer.pieceStored(index);
    this.confirmDigests(peer);
    peer.state = 'finished';
    this.setParents(peer, []);
    for (const other of peer.task.peers.values()) if (other.state === 'waiting') this.schedule(other);
  }

  /** A peer's stream ended: its children lose a parent and are scheduled again. */
  leave(peer: Peer): void {
    if (peer.state === 'left') return;
    const wasReadingOrigin = peer.state === 'backToSource';
    peer.state = 'left';
    this.setParents(peer, []);
    const orphans = [...peer.children];
    for (const child of orphans) {
      child.parents = child.parents.filter((p) => p !== peer);
      peer.children.delete(child);
    }
    peer.task.peers.delete(peer.id);
    peer.host.peers.delete(peer);
    for (const child of orphans) this.schedule(child);
    if (wasReadingOrigin) for (const other of peer.task.peers.values()) if (other.state === 'waiting') this.schedule(other);
    // An empty task is kept a while: its vouched-for digests make restarted holders useful at once.
    peer.task.lastActive = this.hooks.now();
  }

  /** Forgets tasks that have had no peer for `ttlMs`. */
  expireTasks(ttlMs: number): number {
    const now = this.hooks.now();
    let removed = 0;
    for (const [key, task] of this.resources.tasks) {
      if (task.peers.size === 0 && now - task.lastActive > ttlMs) {
        this.resources.tasks.delete(key);
        removed++;
      }
    }
    return removed;
  }

  /**
   * Periodic pass over every downloading peer: new holders may have appeared (a peer short of
   * parents gets more; a strict topology rule may now keep a child on its own side).
   */
  tick(): void {
    const now = this.hooks.now();
    for (const registry of this.onDemand.quietened(now, (r) => this.awaitedPieceArriving(r, now))) this.sayReading(registry, false);
    for (const task of this.resources.tasks.values()) {
      if (this.config.shape === 'adaptive') this.adaptive.tick(task, now);
      for (const peer of [...task.peers.values()]) {
        if (peer.state !== 'running' && peer.state !== 'waiting') continue;
        if (keepsItsParents(peer, this.config, now)) continue;
        this.schedule(peer, peer.parents.length === 0);
      }
    }
  }

  /** A task's state as tests, `starling stat` and the console show it. */
  stat(taskId: string, registry?: string): TaskStat | undefined {
    const task = this.resources.findTask(taskId, registry);
    if (!task) return undefined;
    return {
      taskId: task.id,
      registry: task.registry,
      contentLength: task.contentLength,
      pieceCount: task.pieceCount,
      trustedDigests: task.digests.size,
      confirmedDigests: task.confirmed.size,
      peers: [...task.peers.values()].map((p) => ({
        peerId: p.id,
        hostId: p.host.id,
        pieces: p.pieces.size,
        parents: p.parents.map((parent) => parent.id),
        backToSource: p.state === 'backToSource',
        seed: p.isSeed,
        finished: p.isFinished,
        bytesByParentHost: Object.fromEntries(p.bytesByParentHost),
        labels: p.host.info.labels,
      })),
      bytesFromPeers: task.bytes.peer,
      bytesFromSeeds: task.bytes.seed,
      bytesFromOrigin: task.bytes.origin,
      cyclesDetected: task.cyclesDetected,
    };
  }

  private setParents(peer: Peer, parents: Peer[]): void {
    const before = peer.parents;
    const same = before.length === parents.length && before.every((p, i) => p === parents[i]);
    const now = this.hooks.now();
    for (const old of before) if (!parents.includes(old) && old.children.delete(peer)) old.childLeft(now);
    for (const parent of parents) parent.children.add(peer);
    peer.parents = parents;
    if (!same) {
      peer.parentsSince = now;
      peer.pace.slowArrival = undefined;
      this.log.trace({ task: peer.task.id, peer: peer.id, parents: parents.map((p) => p.id).join(',') }, 'parents');
    }
    // The graph was acyclic before; only the new edges can close a cycle: a parent below the peer.
    const below = parents.length > 0 ? descendantsOf(peer) : undefined;
    if (parents.some((parent) => parent === peer || below?.has(parent))) {
      peer.task.cyclesDetected++;
      this.log.error({ task: peer.task.id, peer: peer.id }, 'parent graph has a cycle');
    }
    if (parents.length > 0) peer.state = 'running';
    if (!same && peer.state !== 'left' && (parents.length > 0 || before.length > 0)) {
      peer.send({
        packet: 'parents',
        parents: { parents: parents.map((parent) => toParentInfo(parent, this.config.shape === 'mesh' ? 0 : 1)) },
      });
    }
  }

  private wait(peer: Peer, reason: string, started: number): void {
    peer.state = 'waiting';
    // Meanwhile a lazy reader may read the spans it needs from the seeds reading the origin.
    const spanSources = [...peer.task.peers.values()]
      .filter((other) => other.isSeed && other.state === 'backToSource' && other.host !== peer.host)
      .map((seed) => toParentInfo(seed, 0));
    peer.send({ packet: 'wait', wait: spanSources.length ? { reason, spanSources } : { reason } });
    this.hooks.onScheduled?.(peer, 'wait', this.hooks.now() - started);
  }

  private sendToOrigin(peer: Peer, reason: string): void {
    this.log.info({ task: peer.task.id, peer: peer.id, reason }, 'peer sent to the origin');
    this.setParents(peer, []);
    peer.pace.originSince ??= this.hooks.now();
    peer.state = 'backToSource';
    peer.send({ packet: 'backToSource', backToSource: { reason } });
    this.hooks.onScheduled?.(peer, 'backToSource', 0);
    // A seed reading the origin serves any piece a child asks for: peers waiting may take it now.
    if (peer.isSeed) this.offerNewHolder(peer);
  }

  private mayReadOrigin(task: Task, peer: Peer): boolean {
    const readers = task.originReaders.filter((reader) => reader !== peer);
    return readers.length < this.config.backToSourceLimit;
  }

  /** Someone is bringing the blob in (an origin reader, or a live seed) among the hosts `where` accepts. */
  private hasActiveSource(task: Task, where: (host: Host) => boolean): boolean {
    for (const peer of task.peers.values()) {
      if (!where(peer.host)) continue;
      if (peer.state === 'backToSource' || (peer.isSeed && peer.state !== 'left')) return true;
    }
    // A seed just asked counts until it registers, unless asking failed or it never showed up.
    const now = this.hooks.now();
    for (const [id, trigger] of task.triggeredSeeds) {
      const seed = this.resources.hosts.get(id);
      if (seed && where(seed) && !trigger.failed && now - trigger.at < SEED_SHOW_UP_MS) return true;
    }
    return false;
  }

  /**
   * A seed to trigger for this child's task: one on the child's side of every strict topology
   * rule when that side has no source yet; any seed (best topology match) when nobody has one.
   */
  private pickSeed(child: Peer): Host | undefined {
    const task = child.task;
    // A seed has no client's credentials: it is asked only for what the registry gives anyone.
    if (!task.origin?.public) return undefined;
    const sameSide = (host: Host) =>
      this.config.topology.every((rule) => {
        if (!rule.strict) return true;
        const mine = child.host.info.labels[rule.key];
        return mine === undefined || host.info.labels[rule.key] === mine;
      });
    const available = this.resources.seedHosts().filter((seed) => !task.triggeredSeeds.has(seed.id) && seed !== child.host);
    let choices: Host[];
    if (!this.hasActiveSource(task, sameSide)) {
      choices = available.filter(sameSide);
      if (!choices.length && !this.hasActiveSource(task, () => true)) choices = available;
    } else {
      choices = [];
    }
    return choices
      .map((seed) => ({ seed, score: this.topologyScore(child, seed) - seed.childCount }))
      .sort((a, b) => b.score - a.score || a.seed.id.localeCompare(b.seed.id))[0]?.seed;
  }

  private topologyScore(child: Peer, host: Host): number {
    let score = 0;
    for (const rule of this.config.topology) {
      const mine = child.host.info.labels[rule.key];
      if (mine !== undefined && host.info.labels[rule.key] === mine) score += rule.weight;
    }
    return score;
  }

  /**
   * Takes the digest an origin reader reported for a piece, to vouch for it to the task's other
   * peers. It is the registry's word: it checks transfers between peers, and a piece matching it
   * is verified only once a whole blob with it verifies (confirmDigests).
   */
  learnDigest(task: Task, index: number, digest: string): void {
    const known = task.digests.get(index);
    if (known === digest) return;
    if (known) {
      this.log.error({ task: task.id, index, known, reported: digest }, 'origin readers disagree about a piece digest; keeping the first');
      return;
    }
    task.digests.set(index, digest);
    this.sendDigests(task, { digests: { [index]: digest } });
  }

  /**
   * The peer's whole blob verified against the blob's digest, so the digests of the pieces it
   * holds are true: they replace what origin readers vouched for (a registry that lied to one of
   * them is overruled), and every peer may count pieces matching them as verified.
   */
  private confirmDigests(peer: Peer): void {
    const task = peer.task;
    const confirmed: Record<number, string> = {};
    for (let index = 0; index < task.pieceCount; index++) {
      // A piece held since before a restart: its digest was never reported on this stream.
      if (task.confirmed.has(index) || !peer.reportedDigests.has(index)) continue;
      const digest = peer.ownDigests.get(index) ?? task.digests.get(index);
      if (!digest) continue;
      const vouched = task.digests.get(index);
      if (vouched && vouched !== digest) {
        this.log.warn(
          { task: task.id, index, vouched, verified: digest },
          'a verified blob overrules the digest an origin reader reported',
        );
      }
      task.digests.set(index, digest);
      task.confirmed.add(index);
      confirmed[index] = digest;
    }
    peer.ownDigests.clear();
    if (Object.keys(confirmed).length > 0) this.sendDigests(task, { digests: confirmed, confirmed: true });
  }

  /**
   * A peer's whole blob did not match its digest. Its pieces came from the origin or were checked
   * against vouched-for digests, so any of those may be a registry's lie: every digest not
   * confirmed is forgotten, here and by the task's peers, and the next origin reader's are learnt.
   */
  contentMismatch(peer: Peer): void {
    const task = peer.task;
    let forgotten = 0;
    for (const index of [...task.digests.keys()]) {
      if (task.confirmed.has(index)) continue;
      task.digests.delete(index);
      forgotten++;
    }
    this.log.warn({ task: task.id, peer: peer.id, forgotten }, "a peer's blob failed its digest: forgot the piece digests not confirmed");
    if (forgotten > 0) this.sendDigests(task, { digests: {}, forgetVouched: true });
    // Seeds drop what they read too: one may be asked again for the next reader.
    task.triggeredSeeds.clear();
  }

  /** A newcomer's digests: the vouched-for ones, then the confirmed ones. */
  private sendKnownDigests(task: Task, send: (packet: SchedulerPacket) => void): void {
    const vouched: Record<number, string> = {};
    const confirmed: Record<number, string> = {};
    for (const [index, digest] of task.digests) (task.confirmed.has(index) ? confirmed : vouched)[index] = digest;
    if (Object.keys(vouched).length > 0) send({ packet: 'digests', digests: { digests: vouched } });
    if (Object.keys(confirmed).length > 0) send({ packet: 'digests', digests: { digests: confirmed, confirmed: true } });
  }

  private sendDigests(task: Task, digests: PieceDigests): void {
    for (const peer of task.peers.values()) {
      // Origin readers have their pieces already, but may still verify them by confirmed digests.
      if (peer.state === 'left' || peer.isFinished) continue;
      if (peer.state === 'backToSource' && !digests.confirmed && !digests.forgetVouched) continue;
      peer.send({ packet: 'digests', digests });
    }
  }
}

const DIGEST = /^sha256:[0-9a-f]{64}$/;

/**
 * `piecesAtOnce`: one in chains (a pipeline, the adaptive shape), where a second piece would split
 * the chain's link in two; 0 (the peer's own choice) for a mesh child.
 */
function toParentInfo(peer: Peer, piecesAtOnce: number): ParentInfo {
  return {
    peerId: peer.id,
    hostId: peer.host.id,
    ip: peer.host.info.ip,
    uploadPort: peer.host.info.uploadPort,
    seed: peer.isSeed,
    piecesAtOnce,
  };
}

/** The registry (scheme://host[:port]) of an origin blob URL; '' when there is none or it does not parse. */
function originRegistry(url: string | undefined): string {
  if (!url) return '';
  try {
    return new URL(url).origin;
  } catch {
    return '';
  }
}
