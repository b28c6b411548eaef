import { itemAt } from '../common/indexing.js';
import type { SchedulingConfig, TopologyRule } from './config.js';
import { SLOW } from './pace.js';
import { canTake, feedsEach, misplaced, offerTo, rankForChild, riderFits, slowFeeder } from './placement.js';
import { descendantsOf, type Peer } from './resources.js';

/**
 * Picks parents for a child: filter the task's peers down to those that may serve it, then
 * score them. Pure functions over the resource model so the simulator drives the same code.
 */

/** Why a candidate was left out; kept for debugging and tests. */
export type Exclusion = 'self' | 'same-host' | 'blocklisted' | 'nothing-to-offer' | 'cycle' | 'overloaded' | 'slow' | 'left' | 'topology';

export function filterCandidates(child: Peer, config: SchedulingConfig, now: number, excluded?: Map<string, Exclusion>): Peer[] {
  const out: Peer[] = [];
  /** Peers that could serve the child but have no room for another child now. */
  const full: Peer[] = [];
  const exclude = (peer: Peer, why: Exclusion) => excluded?.set(peer.id, why);
  // One walk down from the child, not one walk up from each candidate: O(N) per child, not O(N²).
  const below = descendantsOf(child);
  // Once per child, not once per candidate: what it is receiving decides what candidates offer.
  child.forgetStaleStarts(now);
  for (const peer of child.task.peers.values()) {
    if (peer === child) continue;
    if (peer.state === 'left') exclude(peer, 'left');
    else if (peer.host === child.host) exclude(peer, 'same-host');
    else if (child.blocklist.has(peer.id)) exclude(peer, 'blocklisted');
    else if (!offersSomething(peer, child, now)) exclude(peer, 'nothing-to-offer');
    else if (below.has(peer)) exclude(peer, 'cycle');
    else if (!child.parents.includes(peer) && !hasRoomFor(peer, child, config)) {
      exclude(peer, 'overloaded');
      full.push(peer);
    } else out.push(peer);
  }
  // The adaptive shape weighs each parent's measured pace itself (placement.ts).
  const fast = config.shape === 'adaptive' ? out : withoutSlowOutliers(out, config.slowFactor, exclude);
  return applyStrictTopology(child, fast, full, config, exclude);
}

/**
 * How many more children a peer may take. A mesh counts its host's upload slots across tasks.
 * A pipeline counts the peer's own children: a chain forwards a task at the rate it arrives, so
 * a host in the chains of several layers splits its upload the way it splits its download.
 */
export function freeChildSlots(peer: Peer, config: SchedulingConfig): number {
  if (config.shape !== 'mesh') return (peer.isSeed ? config.pipeline.seedFanout : config.pipeline.fanout) - peer.children.size;
  return peer.host.uploadSlots - peer.host.childCount;
}

/** Whether the peer may take this child as well as the ones it has (the adaptive shape: placement.ts). */
function hasRoomFor(peer: Peer, child: Peer, config: SchedulingConfig): boolean {
  if (config.shape === 'adaptive') return canTake(peer, child, config);
  return freeChildSlots(peer, config) > 0;
}

/** Parents handed to one child: several in a mesh, one in chains. */
export function parentLimit(config: SchedulingConfig): number {
  return config.shape === 'mesh' ? config.candidateParentLimit : 1;
}

/**
 * The parent holds, or is receiving and relaying, a piece the child neither holds nor is
 * receiving already. A piece on its way to the child does not count: the child needs nothing
 * more for it, and an edge kept for such a piece forbids the trade the other way (the parent
 * graph must stay a DAG). With 4 MiB pieces on slow links a piece is on its way for many
 * seconds, so counting it kept most edges of a 32-node swarm alive for nothing (simulated
 * last node 1.74-1.83 × T* with it, 1.63-1.70 without). The caller forgets the child's stale
 * starts first (`forgetStaleStarts`), once for all the candidates it asks about. A seed reading
 * the origin offers every piece: it fetches the pieces its children ask for, and only those.
 */
function offersSomething(parent: Peer, child: Peer, now: number): boolean {
  if (parent.isFinished) return !child.isFinished;
  // A seed sent to the origin fetches whatever piece a child asks of it (peer/swarm/swarm.ts).
  if (parent.isSeed && parent.state === 'backToSource') return !child.isFinished;
  if (parent.relaysPieceMissingFrom(child, now)) return true;
  if (parent.pieces.size === 0) return false;
  // More pieces than the child holds and receives: at least one of them is in neither.
  if (parent.pieces.size > child.pieces.size + child.arriving.size) return true;
  return parent.pieces.hasAnyMissingFrom(child.pieces, child.arriving);
}

function withoutSlowOutliers(candidates: Peer[], factor: number, exclude: (p: Peer, why: Exclusion) => void): Peer[] {
  const costs = candidates
    .map((peer) => peer.costPerMiB)
    .filter((cost): cost is number => cost !== undefined)
    .sort((a, b) => a - b);
  if (costs.length < 3) return candidates;
  const median = itemAt(costs, Math.floor(costs.length / 2));
  return candidates.filter((peer) => {
    const slow = peer.costPerMiB !== undefined && peer.costPerMiB > factor * median;
    if (slow) exclude(peer, 'slow');
    return !slow;
  });
}

/** A strict rule keeps the child on its own side of the key whenever its side has a candidate, free or full. */
function applyStrictTopology(
  child: Peer,
  candidates: Peer[],
  full: Peer[],
  config: SchedulingConfig,
  exclude: (p: Peer, why: Exclusion) => void,
): Peer[] {
  let kept = candidates;
  // A parent on the child's side with no room right now still exists: the child waits for its
  // room rather than cross. In a pipeline every peer but a chain's last is full, so without this
  // a child would cross whenever its side's chain had no free end.
  let keptFull = full;
  for (const rule of config.topology) {
    if (!rule.strict) continue;
    const side = child.host.info.labels[rule.key];
    if (side === undefined) continue;
    const onSide = (peer: Peer) => peer.host.info.labels[rule.key] === side;
    const same = kept.filter(onSide);
    const sameFull = keptFull.filter(onSide);
    if (same.length === 0 && sameFull.length === 0) continue;
    for (const peer of kept) if (!onSide(peer)) exclude(peer, 'topology');
    kept = same;
    keptFull = sameFull;
  }
  return kept;
}

export function scoreCandidate(child: Peer, parent: Peer, config: SchedulingConfig, now: number): number {
  const { weights } = config;
  let score = 0;
  for (const rule of config.topology) {
    const mine = child.host.info.labels[rule.key];
    if (mine !== undefined && parent.host.info.labels[rule.key] === mine) score += rule.weight;
  }
  const slots = parent.host.uploadSlots;
  score += weights.freeUpload * Math.max(0, (slots - parent.host.childCount) / slots);
  score += weights.pieces * (parent.pieces.size / parent.task.pieceCount);
  if (parent.isSeed) score += weights.seed;
  score -= weights.failure * parent.recentFailures(now);
  return score;
}

/** Reasons that are passing: a current parent excluded only for one of these is kept. */
const MOMENTARY: ReadonlySet<Exclusion> = new Set(['nothing-to-offer', 'overloaded']);

/**
 * Why `parent` was left out is likely to pass soon: a full parent frees a slot as its children
 * finish, and one with nothing new gets more while it downloads. One that has finished, or a lazy
 * reader that wants nothing (idle), gets no piece it does not hold: kept as a whole download's
 * only parent, it stalled that download until the origin (60 s).
 */
export function momentarilyOut(parent: Peer, why: Exclusion | undefined): boolean {
  if (why === undefined || !MOMENTARY.has(why)) return false;
  return why !== 'nothing-to-offer' || stillDownloading(parent);
}

function stillDownloading(peer: Peer): boolean {
  return !peer.isFinished && !peer.idle;
}

/**
 * The best K parents for a child: current parents that still have something for it, then the
 * best-scored new candidates, then current parents that have nothing new right now (they are
 * likely to have something in a moment, and dropping and re-adding them every round would make
 * the child's links flap) while there is room. A parent with nothing new is dropped outright when
 * the child now holds pieces it lacks: the parent graph must stay a DAG, so an edge kept one way
 * forbids the trade the other way, and nodes that got ahead would never serve those they took from.
 * `excluded` receives why each other peer of the task was left out.
 */
export function selectParents(child: Peer, config: SchedulingConfig, now: number, excluded = new Map<string, Exclusion>()): Peer[] {
  if (config.shape === 'adaptive') return selectAdaptive(child, config, now, excluded);
  const candidates = filterCandidates(child, config, now, excluded);
  const useful = child.parents.filter((parent) => candidates.includes(parent));
  const idle = child.parents.filter((parent) => {
    if (candidates.includes(parent)) return false;
    const why = excluded.get(parent.id);
    if (why === 'nothing-to-offer' && !parent.isSeed) {
      parent.forgetStaleStarts(now); // it is the receiving side here
      if (offersSomething(child, parent, now)) return false;
    }
    return momentarilyOut(parent, why) && onAllowedSide(child, parent, candidates, config);
  });
  const ranked = candidates
    .filter((peer) => !useful.includes(peer))
    .map((peer) => ({ peer, score: scoreCandidate(child, peer, config, now) }))
    .sort((a, b) => b.score - a.score || a.peer.id.localeCompare(b.peer.id));
  const limit = parentLimit(config);
  const chosen = useful.slice(0, limit);
  for (const peer of [...ranked.map((r) => r.peer), ...idle]) {
    if (chosen.length >= limit) break;
    chosen.push(peer);
  }
  return chosen;
}

/**
 * The adaptive shape's one parent (placement.ts): the current one while it can serve, unless it
 * is a passenger and the child holds a chain slot (a passenger feeds no chain), or the child is a
 * passenger sharing a chain's upload; then the best ranked candidate, if any.
 */
function selectAdaptive(child: Peer, config: SchedulingConfig, now: number, excluded: Map<string, Exclusion>): Peer[] {
  const candidates = filterCandidates(child, config, now, excluded);
  const ranked = rankForChild(child, candidates, now, (peer) => scoreCandidate(child, peer, config, now));
  const current = child.parents[0];
  // Momentarily nothing new (a chain's child caught up with it) or full: kept while allowed.
  const usable = (peer: Peer) => {
    if (candidates.includes(peer)) return true;
    return momentarilyOut(peer, excluded.get(peer.id)) && onAllowedSide(child, peer, candidates, config) && !peer.isFinished;
  };
  if (current && usable(current)) {
    if (!misplaced(child, current)) return [current];
    const best = ranked.find((peer) => peer !== current);
    if (!best) return [current];
    // A rider moves where it fits; a chain child where it is fed clearly faster.
    const better = slowFeeder(child) ? riderFits(best, child) : offerTo(best, child, now) * SLOW > (feedsEach(current) ?? 0);
    return better ? [best] : [current];
  }
  return ranked[0] ? [ranked[0]] : [];
}

/**
 * The child has its full count of parents and each still offers it something (or, in a pipeline,
 * is still downloading) from its own side of every strict topology rule: a selection would hand
 * out the same parents, so the periodic pass can skip it. Without this the pass re-selects every
 * running peer against every other, O(N²): 0.6 s every 2 s at 1000 peers. (It skips the
 * slow-outlier check too; a child reports a parent that stalls it, and that reschedules it.)
 */
export function keepsItsParents(child: Peer, config: SchedulingConfig, now: number): boolean {
  if (child.parents.length < parentLimit(config)) return false;
  // A chain child of a slow feeder, held back, or a passenger in a chain's way: a better place may have freed up.
  if (config.shape === 'adaptive' && child.parents[0] !== undefined && misplaced(child, child.parents[0])) return false;
  child.forgetStaleStarts(now);
  for (const parent of child.parents) {
    if (parent.state === 'left' || child.blocklist.has(parent.id)) return false;
    if (!offersSomething(parent, child, now) && !feedsAChain(parent, config)) return false;
    if (config.topology.some((rule) => crossesStrictKey(child, parent, rule))) return false;
  }
  return true;
}

/**
 * A pipeline parent still downloading: a child that has caught up with it (it holds what the
 * parent holds and receives what the parent relays) is a chain's steady state, not a reason to
 * look for another parent. A parent that stalls is reported by its child, which reschedules it.
 */
function feedsAChain(parent: Peer, config: SchedulingConfig): boolean {
  return config.shape !== 'mesh' && stillDownloading(parent);
}

/** A strict rule allows a parent across its key only while no candidate is on the child's side. */
function onAllowedSide(child: Peer, parent: Peer, candidates: Peer[], config: SchedulingConfig): boolean {
  for (const rule of config.topology) {
    if (!crossesStrictKey(child, parent, rule)) continue;
    if (candidates.some((peer) => !crossesStrictKey(child, peer, rule))) return false;
  }
  return true;
}

/** `rule` is strict, the child has a side of its key, and `peer` is on another. */
function crossesStrictKey(child: Peer, peer: Peer, rule: TopologyRule): boolean {
  if (!rule.strict) return false;
  const side = child.host.info.labels[rule.key];
  return side !== undefined && peer.host.info.labels[rule.key] !== side;
}
