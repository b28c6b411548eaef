import type { Logger } from '../common/log.js';
import type { PieceFinished } from '../rpc/scheduler-api.js';
import { SLOW } from './pace.js';
import {
  chainToMerge,
  chainToSplit,
  downloadSharers,
  farBelowReference,
  feedRate,
  feedsEach,
  chainChildren,
  heldBack,
  paceOf,
  probeTargets,
  roomOf,
  roomToTry,
  chainsBelow,
  type ChainsBelow,
  slowFeeder,
  uploadSharers,
} from './placement.js';
import type { Peer, Resources, RoomTrial, Task } from './resources.js';

/** What the adaptive shape needs of the scheduling engine. */
export interface AdaptiveEngine {
  readonly resources: Resources;
  readonly log: Logger;
  /** Chooses the peer's parents again (selection.ts, placement.ts). */
  reschedule(peer: Peer): void;
  /** Makes `parent` the peer's one parent now. */
  moveTo(peer: Peer, parent: Peer): void;
  /** `parent` may serve `child` (same host, blocklist, cycles, strict topology), room aside, and so may a chain parent it has caught up with. */
  mayServe(child: Peer, parent: Peer): boolean;
}

/**
 * The adaptive shape's measurements and the moves they call for (placement.ts has the rules),
 * driven by the engine's events: stored pieces, and the periodic pass.
 */
export class Adaptation {
  constructor(private readonly engine: AdaptiveEngine) {}

  /** A piece was stored at `now` (its first byte arrived at `startedAt`, when reported). */
  stored(peer: Peer, report: PieceFinished, length: number, startedAt: number | undefined, now: number): void {
    const task = peer.task;
    peer.pace.stored(report.index, length, now, startedAt, report.fromOrigin ? 0 : report.costMs, peer.growing.size > 0, peer.joinedAt);
    const links = peer.host.links;
    const intake = peer.pace.intake.rate;
    const parent = !report.fromOrigin && report.parentId ? task.peers.get(report.parentId) : undefined;
    if (intake !== undefined) {
      const cleared = links.sawIntake(intake);
      // Its download was not the slow end after all: the parent whose transfer showed the cap was,
      // unless that parent's host just fed it this faster intake itself.
      const blamed = cleared.clearedCapFrom ? this.engine.resources.hosts.get(cleared.clearedCapFrom) : undefined;
      if (blamed && blamed !== parent?.host && cleared.cap !== undefined && blamed.links.blameUpload(cleared.cap)) {
        this.engine.log.debug({ task: task.id, peer: peer.id, blamed: blamed.id, bytesPerMs: cleared.cap }, 'upload capped');
        for (const feeder of blamed.peers) if (feeder.task === task && slowFeeder(feeder)) this.retire(feeder);
      }
    }
    raiseReference(task, peer);
    if (parent && startedAt !== undefined) {
      // Enough of its pieces that every child's latest counts, however many share its upload.
      parent.host.links.delivered(startedAt, now, length, Math.max(DELIVERY_WINDOW, 2 * uploadSharers(parent)));
    }
    this.check(task, now);
  }

  /** The periodic pass: every arrival checked, parents shed chains they cannot carry, and seeds with room split held-back chains. */
  tick(task: Task, now: number): void {
    this.check(task, now, true);
    this.mergeChains(task);
    this.splitChains(task);
  }

  /**
   * Pieces still arriving long after they should have. A child's copy of a piece its parent was
   * relaying as it came is judged against the parent's own copy: arriving more than 1/SLOW as long
   * after it began as the parent's took to be stored, the child's download is slow. (Against the
   * same piece, not the parent's pace now: a parent that just sped up relays an old slow piece at
   * its old pace, and a chain stalled above both shows in the parent first.) A piece the parent
   * held whole is judged against what the parent feeds each child. Found while the piece runs, not
   * at its end: at 3 Mbit/s a 4 MiB piece takes 11 s, and every peer below waits meanwhile.
   * Separately, a child receiving far below the task's reference (a bound on its pieces since
   * they began) is held back, and looks for a parent with room. Checked on the task's reports, at
   * most four times per piece time of its fastest node, and at every periodic pass.
   */
  private check(task: Task, now: number, force = false): void {
    const state = task.adaptive;
    const interval = Math.min(250, Math.max(1, task.pieceSize / (state.referenceRate || 1) / 4));
    if (!force && now - state.checkedAt < interval) return;
    state.checkedAt = now;
    updateReference(task);
    for (const peer of [...task.peers.values()]) {
      if (peer.state !== 'running' || peer.parents.length === 0) continue;
      // It rides now (its upload found full below the reference, or the reference rose past its
      // cap) and still feeds a chain: the chain goes to its parent. Simulated, 1000 nodes (rng
      // seed 8): a node found full rode under a 5 Gbit/s passenger with 875 nodes below it.
      if (slowFeeder(peer) && chainChildren(peer).length > 0) this.retire(peer);
      const arriving = peer.arrivingFromParents();
      // A peer trying a chain more shares its upload on purpose: what its children began meanwhile judges nothing.
      const shared = sharedUntil(peer);
      if (shared !== undefined && arriving.some(([, start]) => start < shared)) continue;
      const onlyParent = peer.parents.length === 1 ? peer.parents[0] : undefined;
      const sharers = downloadSharers(peer);
      const slow = onlyParent ? slowAgainstParent(peer, onlyParent, arriving, now, sharers) : undefined;
      if (onlyParent && slow) {
        // What the host's download carried, its other tasks' shares included: the link's measure.
        const hostRate = slow.rate * sharers;
        const cap = peer.host.links.downCap;
        // Found slow before and no slower now: nothing new.
        if (cap !== undefined && hostRate > SLOW * cap) continue;
        peer.pace.slowArrival = slow;
        this.slowDownload(onlyParent, peer, hostRate);
        continue;
      }
      const bound = peer.pace.receiveBound(arriving, now, task.pieceSize);
      const known = peer.pace.slowArrival;
      // Held back by its chain: a parent with room may feed it faster.
      if (!bound || !heldBack(peer, bound.rate)) continue;
      if (known && known.since === bound.since && bound.rate > SLOW * known.rate) continue;
      peer.pace.slowArrival = bound;
      this.engine.reschedule(peer);
    }
    this.tryRoom(task, now);
  }

  /**
   * Peers learn what their upload carries by using it (placement.ts roomToTry): one chain more at
   * a time, kept when their children then take about that much more together (ROOM_KEPT), else
   * put back and the upload marked full. A trial lasts TRIAL_PIECE_TIMES of the peer's pace, long
   * enough for the delivery window to hold only pieces sent during it. Seeds first: a node tries
   * only while no seed does, none above or below it does (their moves would change the rates it is
   * judged on), and its pull is long enough to pay for a trial that fails (MIN_PIECES_LEFT).
   */
  private tryRoom(task: Task, now: number): void {
    const trials = task.adaptive.roomTrials;
    for (const [peer, trial] of [...trials]) this.judgeTrial(peer, trial, now);
    let chains = chainsBelow(task);
    let seedTrying = false;
    for (const seed of task.peers.values()) {
      if (!seed.isSeed || seed.state === 'left') continue;
      if (trials.has(seed) || this.startTrial(seed, chains, now)) seedTrying = true;
    }
    if (seedTrying) return;
    for (const peer of task.peers.values()) {
      if (peer.isSeed || peer.state !== 'running' || trials.has(peer)) continue;
      if (task.pieceCount - peer.pieces.size < MIN_PIECES_LEFT) continue;
      // Started: the chains moved, and the peers above and below it must see it.
      if (this.startTrial(peer, chains, now, true)) chains = chainsBelow(task);
    }
  }

  /** `alone`: not while a trial runs above or below the peer (tested only for a peer that could try: it walks the chains). */
  private startTrial(peer: Peer, chains: ChainsBelow, now: number, alone = false): boolean {
    const child = roomToTry(peer, chains);
    const pace = paceOf(peer);
    if (!child || pace === undefined || (alone && chains.nearTrial(peer)) || !this.mayServe(child, peer)) return false;
    peer.task.adaptive.roomTrials.set(peer, { child, from: child.parents[0], since: now, chains: chainChildren(peer).length, pace });
    this.engine.log.debug({ task: peer.task.id, peer: peer.id, child: child.id }, 'room trial');
    this.engine.moveTo(child, peer);
    return true;
  }

  private judgeTrial(peer: Peer, trial: RoomTrial, now: number): void {
    const task = peer.task;
    const { child } = trial;
    // Moved elsewhere, or gone: the trial says nothing.
    if (peer.state === 'left' || child.state !== 'running' || child.parents[0] !== peer) {
      task.adaptive.roomTrials.delete(peer);
      return;
    }
    if (now - trial.since < (TRIAL_PIECE_TIMES * task.pieceSize) / trial.pace) return;
    task.adaptive.roomTrials.delete(peer);
    peer.roomTrialEndedAt = now;
    const took = peer.host.links.lastDelivered;
    if (took >= (peer.isSeed ? ROOM_KEPT : NODE_ROOM_KEPT) * (trial.chains + 1) * trial.pace) {
      this.engine.log.debug({ task: task.id, peer: peer.id, bytesPerMs: took }, 'room found');
      return;
    }
    // Its own intake fell meanwhile: its children could take no more than it got, which says nothing of its upload.
    const paceNow = paceOf(peer);
    if (paceNow !== undefined && paceNow >= SLOW * trial.pace) {
      // No less than its chains took before (each at its pace, or roomToTry would not have tried).
      const full = Math.max(took, trial.chains * trial.pace);
      peer.host.links.foundUploadFull(full);
      this.engine.log.debug({ task: task.id, peer: peer.id, bytesPerMs: full }, 'upload full');
    } else {
      this.engine.log.debug({ task: task.id, peer: peer.id, bytesPerMs: paceNow }, 'room trial says nothing: its intake fell');
    }
    const back = trial.from;
    if (back && back.state !== 'left' && this.mayServe(child, back)) this.engine.moveTo(child, back);
    else this.engine.reschedule(child);
  }

  /**
   * The child's download ran slower than its parent fed it. It is blamed, not the parent's upload:
   * links are mostly symmetric, so a slow download is a slow upload too (a cap put on the wrong
   * end moves when the child does clearly better elsewhere: see stored()). A child now a passenger
   * (placement.ts) gives its chain slot to its chain children, which take its place under its
   * parent, and looks for a chain's end to ride at.
   */
  private slowDownload(parent: Peer, child: Peer, rate: number): void {
    const task = child.task;
    const known = child.host.links.downCap;
    child.host.links.capDownload(rate, parent.host.id);
    updateReference(task);
    if (known !== undefined && rate > SLOW * known) return;
    this.engine.log.debug({ task: task.id, parent: parent.id, child: child.id, bytesPerMs: rate }, 'slow download');
    if (slowFeeder(child)) this.retire(child);
  }

  /**
   * A peer that now rides (placement.ts slowFeeder) gives its chain slot up: its chain children
   * take its place under its parent, and it looks for a chain's end to ride at.
   */
  private retire(rider: Peer): void {
    this.engine.log.debug({ task: rider.task.id, peer: rider.id }, 'rides at a chain end');
    const parent = rider.parents[0];
    for (const below of [...rider.children]) {
      if (below.state !== 'running' || below.parents[0] !== rider || slowFeeder(below)) continue;
      if (parent && this.mayServe(below, parent)) this.engine.moveTo(below, parent);
      else this.engine.reschedule(below);
    }
    if (rider.state === 'running') this.engine.reschedule(rider);
  }

  /**
   * Every move of this shape asks here: `parent` may serve `child`, room aside
   * (AdaptiveEngine.mayServe), but a peer that rides takes no chain child, however much room it
   * has (seen simulated: a trial's child sent back to a parent found slow meanwhile, with the
   * chain below it).
   */
  private mayServe(child: Peer, parent: Peer): boolean {
    if (slowFeeder(parent) && !slowFeeder(child)) return false;
    return this.engine.mayServe(child, parent);
  }

  /** A parent feeding more chains than its upload carries at their pace sheds its slowest (placement.ts chainToMerge); one per parent and pass. */
  private mergeChains(task: Task): void {
    for (const parent of [...task.peers.values()]) {
      if (parent.state === 'left') continue;
      const merge = chainToMerge(parent);
      const end = merge?.ends.find((peer) => this.mayServe(merge.child, peer));
      if (!merge || !end) continue;
      this.engine.log.debug({ task: task.id, peer: parent.id, child: merge.child.id, parent: end.id }, 'chains merged');
      this.engine.moveTo(merge.child, end);
    }
  }

  /**
   * A seed with room for a whole chain more than it feeds takes one (placement.ts chainToSplit);
   * one per seed and pass. While the reference is unconfirmed, it takes probes instead
   * (placement.ts probeTargets).
   */
  private splitChains(task: Task): void {
    const reference = task.adaptive.referenceRate;
    for (const seed of [...task.peers.values()]) {
      if (!seed.isSeed || seed.state === 'left') continue;
      if (!task.adaptive.referenceConfirmed) {
        for (const probe of probeTargets(seed)) {
          if (!this.mayServe(probe, seed)) continue;
          task.adaptive.probes.push(probe);
          this.engine.log.debug({ task: task.id, seed: seed.id, child: probe.id }, 'probe');
          this.engine.moveTo(probe, seed);
        }
        continue;
      }
      const room = roomOf(seed);
      const pace = Math.min(paceOf(seed) ?? Infinity, reference || Infinity);
      if (room === undefined || !Number.isFinite(pace) || room <= SLOW * pace) continue;
      const child = chainToSplit(seed);
      if (!child || !this.mayServe(child, seed)) continue;
      this.engine.log.debug({ task: task.id, seed: seed.id, child: child.id }, 'chain split');
      this.engine.moveTo(child, seed);
    }
  }
}

/**
 * The child's slowest piece found slow against its parent's copy (see Adaptation.check), as a
 * bound on its rate and since when. `sharers` transfers share the host's download (placement.ts
 * downloadSharers): the piece may take that many times as long. Pieces asked of earlier parents
 * still arriving share the child's download too: each may take one more share, and the rate found
 * is all it can have received since the piece began, every piece on its way counted whole. (Left
 * unjudged until they ended, a 2 Mbit/s node moved a few times hid for two of its piece times,
 * 30 s, heading a chain of 20 Mbit/s nodes: simulated, 32 nodes, 20/10/2 Mbit/s.)
 */
function slowAgainstParent(
  child: Peer,
  parent: Peer,
  arriving: Array<[number, number]>,
  now: number,
  sharers: number,
): { since: number; rate: number } | undefined {
  const earlier = child.growing.size - arriving.length;
  const size = child.task.pieceSize;
  let found: { since: number; rate: number } | undefined;
  for (const [index, start] of arriving) {
    if (now <= start) continue;
    const parentStored = parent.pace.storedAt.get(index);
    const elapsed = now - start;
    // How long the piece should take alone (alone), and with the host's download shared
    // (due); it is late past 1/SLOW of that, and MIN_LATE_MS beyond it.
    let alone: number;
    if (parentStored !== undefined && parentStored > start) {
      // No faster than the parent received it, nor than its upload's share for each child allowed meanwhile.
      const each = feedsEach(parent, start);
      alone = Math.max(parentStored - start, each === undefined ? 0 : size / each);
    } else if (parentStored !== undefined || parent.isFinished || (parent.isSeed && parent.pieces.has(index))) {
      const each = feedsEach(parent, start);
      alone = each === undefined ? Infinity : size / each;
    } else {
      alone = Infinity; // the parent is still receiving it
    }
    const due = alone * sharers * (1 + earlier);
    if (elapsed <= due / SLOW || elapsed - due < MIN_LATE_MS) continue;
    let rate: number | undefined;
    if (earlier > 0) rate = child.pace.receiveBound([...child.growing], now, size, start)?.rate;
    else {
      // Pieces of an earlier parent stored meanwhile shared the download too: a node moved to a
      // seed while its last piece from its chain still came got each at half its link, and was
      // found slow (and sent to ride) the moment that piece was stored (emulated, 32 nodes at
      // 10 Mbit/s with a few at 3-4: 18 fast nodes in ten runs; 1 in seven judged so). Late, but
      // its download carried what this piece alone should have had: it is not slow.
      rate = child.pace.carriedSince(child.growing.size, start, now, size);
      if (rate !== undefined && rate * sharers >= (SLOW * size) / alone) continue;
    }
    if (rate !== undefined && (!found || rate < found.rate)) found = { since: start, rate };
  }
  return found;
}

/** Until when the peer's parents shared their upload on purpose (a room trial running or just ended), if they did. */
function sharedUntil(peer: Peer): number | undefined {
  const state = peer.task.adaptive;
  let until: number | undefined;
  for (const parent of peer.parents) {
    const end = state.roomTrials.has(parent) ? Infinity : parent.roomTrialEndedAt;
    if (end !== undefined && (until === undefined || end > until)) until = end;
  }
  return until;
}

/** How long a peer's trial of one chain more runs, in piece times at its pace (see Adaptation.tryRoom). */
const TRIAL_PIECE_TIMES = 8;

/**
 * The fewest pieces a node has left to try one chain more: a trial that fails feeds the chains
 * below it at a fraction of their pace for its length, which must stay a small share of their
 * pull (an eighth). A pull of 16 pieces, as on the emulated cluster, never pays for one.
 */
const MIN_PIECES_LEFT = 8 * TRIAL_PIECE_TIMES;

/**
 * The share of one more chain at the peer's pace its children must take together for the chain to
 * stay: a peer with room for one and a half chains would otherwise feed two at three quarters of
 * its pace, and every node below would end a third later.
 */
const ROOM_KEPT = 0.9;

/**
 * The same for a node: its second chain slows only the chains below it, and halves their length,
 * and each hop costs a share of a piece time. Simulated, 1000 nodes at 50 Gbit/s under a 25 Gbit/s
 * registry (two chains at 47 Gbit/s are the link itself): at 0.9 most trials failed and cost their
 * chains time, 2.06 × T* against 1.94 without node trials; at 0.8, 1.90.
 */
const NODE_ROOM_KEPT = 0.8;

/** The fewest pieces a parent's children stored from it that measure what it delivers. */
const DELIVERY_WINDOW = 8;

/**
 * How late a piece must be, beyond its due time, to be judged slow: the reports' own delays
 * (messages, event loops) are of this order, and a piece of a fast link takes less.
 */
const MIN_LATE_MS = 2;

/**
 * The task's reference rate: the most a node was measured to receive (not a seed: a seed may be
 * many times faster than any node, and every node would look slow). Confirmed once it says how
 * fast nodes are: a node fed through no peer found slow was measured and not found slow itself,
 * or MAX_WITNESSES nodes fed through no peer found slow were measured (all found slow against a
 * seed, as every node of a cluster may be). A node below a peer found slow shows that peer's
 * pace, not its own.
 */
function updateReference(task: Task): void {
  const state = task.adaptive;
  state.referenceRate = 0;
  const fed: Peer[] = [];
  for (const peer of task.peers.values()) {
    if (peer.isSeed || peer.state === 'left' || peer.isFinished) continue;
    const feed = feedRate(peer);
    if (feed === undefined) continue;
    if (feed > state.referenceRate) state.referenceRate = feed;
    fed.push(peer);
  }
  let witnesses = 0;
  let unslowed = false;
  const clean = new Map<Peer, boolean>();
  for (const peer of fed) {
    if (!fedCleanly(peer, clean)) continue;
    witnesses++;
    if (peer.host.links.downCap === undefined) unslowed = true;
  }
  state.referenceConfirmed = unslowed || witnesses >= MAX_WITNESSES;
}

/** Nodes fed through no slow peer that confirm the reference when all of them were found slow against a seed. */
const MAX_WITNESSES = 3;

/** The peer holds the peers below it back: a cap was measured, or it announced an upload limit far below the reference. */
function holdsBack(peer: Peer): boolean {
  const links = peer.host.links;
  if (links.downCap !== undefined || links.upCap !== undefined) return true;
  return links.uploadLimit !== undefined && farBelowReference(peer, links.uploadLimit);
}

/** No peer above this one, up to a seed or a holder of the blob, holds it back (memoized per pass in `clean`). */
function fedCleanly(peer: Peer, clean: Map<Peer, boolean>): boolean {
  const path: Peer[] = [];
  let result = true;
  for (let above = peer.parents[0]; above; above = above.parents[0]) {
    const known = clean.get(above);
    if (known !== undefined) {
      result = known;
      break;
    }
    if (above.isSeed || above.isFinished) break;
    path.push(above);
    if (holdsBack(above) || path.length > 1000) {
      result = false;
      break;
    }
  }
  // Every peer on the path is clean (for its own children) exactly when everything above it is.
  for (const above of path) clean.set(above, result && !holdsBack(above));
  return result;
}

function raiseReference(task: Task, peer: Peer): void {
  if (peer.isSeed || peer.state === 'left' || peer.isFinished) return;
  const feed = feedRate(peer);
  if (feed !== undefined && feed > task.adaptive.referenceRate) task.adaptive.referenceRate = feed;
}
