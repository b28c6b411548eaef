import type { SchedulingConfig } from './config.js';
import { SLOW } from './pace.js';
import type { Peer, Task } from './resources.js';

/**
 * The adaptive shape's placement rules: pure functions of what the scheduler measured (pace.ts).
 *
 * Peers form chains as in a pipeline: one parent per child, one piece at a time, so that every
 * byte is relayed as it arrives at the full rate of the link. What the measurements change:
 *
 *  - a peer whose download was found slower than SLOW of what its parent fed it, and slower than
 *    SLOW of the task's reference rate (the most a node has been measured to receive), rides as a
 *    passenger: it gives its chain slot to its chain child, which takes its place under its
 *    parent (a slow peer in the middle of a chain stops holding back the peers below it), and
 *    rides where it delays no one: under a peer feeding no chain (a chain's end) or under another
 *    passenger, at the slowest one with spare enough to show more than its cap (riderNeeds: a cap
 *    found too low is found wrong there). A peer whose upload was
 *    found slow, or that announced an upload limit that slow (--upload-rate-limit), rides the
 *    same way: it feeds no chain, and receives at a chain's end at the chain's pace;
 *  - a parent takes a chain child while it has a free chain slot (the pipeline's fan-out), or
 *    measured upload to spare for another child at its pace (a seed with a link several times a
 *    node's feeds several chains);
 *  - a chain child held back far below the reference moves to a parent with room that feeds it
 *    clearly faster, taking the chain below along;
 *  - a seed with room for a whole chain more takes the middle of the longest held-back chain,
 *    which halves it (see chainToSplit);
 *  - a parent whose upload carries its chains at less than SLOW of its pace moves its slowest
 *    chain below the end of another (see chainToMerge).
 *
 * Simulated, uneven 32-node clusters (24 nodes at 10 Mbit/s, 8 at 3) and the one that slows to a
 * tenth mid-pull are in docs/benchmarks.md. Helpers (a second parent for a held-back child) were
 * tried and dropped: a child receiving two pieces at once gets each at half rate, and its own
 * chain child, relaying one of them, gets half; the simulated chains collapsed into a mesh.
 *
 * Rates are bytes per millisecond.
 */

/** How far up the chain expectedPace looks for a measured pace or a slow bound. */
const EXPECTED_PACE_HOPS = 64;

/** Chain ends a seed takes, one after another, while no node not found slow has been measured (see chainToSplit). */
const MAX_PROBES = 3;

/** The most the peer can feed a child, if one of its links was measured slow. */
export function capOf(peer: Peer): number | undefined {
  return peer.host.links.cap;
}

/** How fast the peer receives now; Infinity when it holds the blob; undefined until measured. */
export function feedRate(peer: Peer): number | undefined {
  return peer.isFinished ? Infinity : peer.pace.feedRate;
}

/** How fast the peer can feed one child: no faster than it receives, nor than a cap. Undefined when unknown. */
export function paceOf(peer: Peer): number | undefined {
  const feed = feedRate(peer);
  const cap = capOf(peer);
  if (feed === undefined) return cap;
  return Math.min(feed, cap ?? Infinity);
}

/**
 * How fast the peer can send in all: a measured cap (links are mostly symmetric: a slow download
 * is taken for a slow upload), else the most it was seen to receive or send; never more than the
 * upload limit it announced. Undefined when nothing is known.
 */
export function uploadEstimate(peer: Peer): number | undefined {
  const links = peer.host.links;
  const limit = links.uploadLimit ?? Infinity;
  const cap = links.upCap ?? links.downCap;
  if (cap !== undefined) return Math.min(cap, limit);
  const seen = Math.max(links.bestIntake, links.bestDelivered);
  if (seen > 0) return Math.min(seen, limit);
  return links.uploadLimit;
}

/** Below SLOW of the task's reference rate: a rate that holds a chain back. */
export function farBelowReference(peer: Peer, rate: number): boolean {
  return rate < SLOW * peer.task.adaptive.referenceRate;
}

/**
 * The peer receives far below what it could: its host's download (this task's rate times its
 * downloadSharers) below SLOW of the reference and of its own download's cap, when one was found
 * (a node on a slower link than the fastest one is not held back by receiving at its own rate;
 * without this, most of 1000 nodes with a spread of rates looked held back and were placed again
 * and again).
 */
export function heldBack(peer: Peer, rate: number): boolean {
  const hostRate = rate * downloadSharers(peer);
  return hostRate < SLOW * Math.min(peer.task.adaptive.referenceRate, peer.host.links.downCap ?? Infinity);
}

/** The download cap of a peer found slow against the task's reference: it rides as a passenger. */
export function passengerCap(peer: Peer): number | undefined {
  const cap = peer.host.links.downCap;
  return cap !== undefined && farBelowReference(peer, cap) ? cap : undefined;
}

/**
 * A peer that must feed no chain, and rides at a chain's end like a passenger: a passenger, or one
 * whose upload was found (or announced) that slow.
 */
export function slowFeeder(peer: Peer): boolean {
  if (peer.isSeed) return false; // the one that brings the blob in feeds the swarm, slow or not
  const cap = capOf(peer);
  return cap !== undefined && farBelowReference(peer, cap);
}

/** The peer's children that hold chain slots (not riders: see slowFeeder), leaving `except` out. */
export function chainChildren(peer: Peer, except?: Peer): Peer[] {
  return [...peer.children].filter((child) => child !== except && !slowFeeder(child));
}

/**
 * What a child takes of its parent's upload: the parent's pace, or less: its own download's cap,
 * else the task's reference (no node was measured to receive more). Infinity when nothing bounds
 * it: such a child leaves a parent no room for another.
 */
export function takes(parent: Peer, child: Peer): number {
  return Math.min(paceOf(parent) ?? Infinity, child.host.links.downCap ?? (child.task.adaptive.referenceRate || Infinity));
}

/**
 * Measured upload the peer has left for chains after what its chain children take (leaving
 * `except` out): riders give way to chains (a rider under a chain's feeder moves to a chain's
 * end). Undefined when not measured.
 */
export function roomOf(peer: Peer, except?: Peer): number | undefined {
  const upload = uploadEstimate(peer);
  if (upload === undefined) return undefined;
  let used = 0;
  for (const child of chainChildren(peer, except)) used += takes(peer, child);
  return Math.max(0, upload - used);
}

/**
 * Transfers sharing the peer's download now: its own, and one for each other task of its host with
 * pieces arriving. A node mounting an image lazily reads its layers at once, one task each, and
 * each layer gets a share of its link: that is no slow link. (Judged per task, 8 nodes mounting a
 * 4-layer image were all found slow against the seed and sent to ride, bench/e2e-cluster.ts.)
 */
export function downloadSharers(peer: Peer): number {
  let sharers = 1;
  for (const other of peer.host.peers) if (other !== peer && other.state === 'running' && other.growing.size > 0) sharers++;
  return sharers;
}

/**
 * Children sharing the parent's upload: its own in this task (the most at one time since `since`,
 * when given: a piece begun then got no more than that share), and those of its host's other
 * tasks with pieces arriving now (an idle lazy reader takes nothing).
 */
export function uploadSharers(parent: Peer, since?: number): number {
  let sharers = since === undefined ? parent.children.size : parent.childrenSince(since);
  for (const other of parent.host.peers) {
    if (other === parent) continue;
    for (const child of other.children) if (child.growing.size > 0) sharers++;
  }
  return Math.max(1, sharers);
}

/**
 * What the parent should feed each of its children, to judge one of them slow: its pace, and no
 * more than a share of its upload (a seed's children share its link, riders too, and so do its
 * host's children in other tasks), the least share it gave since `since` when given (a piece
 * begun then). Undefined when unknown or unlimited.
 */
export function feedsEach(parent: Peer, since?: number): number | undefined {
  const pace = paceOf(parent) ?? Infinity;
  const upload = uploadEstimate(parent);
  const share = upload === undefined ? Infinity : upload / uploadSharers(parent, since);
  const each = Math.min(pace, share);
  return Number.isFinite(each) ? each : undefined;
}

/**
 * How fast the peer can feed one child, as far as is known at `now`: its pace once measured.
 * Before that, unlimited (Infinity: as good as any parent), unless what it has received since its
 * oldest piece on its way began (a bound that tightens while a slow node's first piece crawls
 * in), or its parent's pace (and so on up to a measured one), is far below the reference. Taken
 * for unlimited whatever it received, a 2 Mbit/s node moved before it stored a piece drew a
 * 20 Mbit/s child that then waited 60 s on it (simulated, 32 nodes, 20/10/2 Mbit/s); taken at any
 * bound at all, 1000 nodes' first placements changed and the median went from 1.16 to 1.22 of
 * their own bound (rng seed 1).
 */
export function expectedPace(peer: Peer, now: number): number {
  const measured = paceOf(peer);
  if (measured !== undefined) return measured;
  let expected = Infinity;
  let up: Peer | undefined = peer;
  // A few hops say enough: at a task's start whole chains are unmeasured, and every candidate of every child is asked.
  for (let hops = 0; up && hops < EXPECTED_PACE_HOPS; hops++, up = up.parents[0]) {
    const pace = paceOf(up);
    if (pace !== undefined) {
      expected = Math.min(expected, pace);
      break;
    }
    const bound = up.pace.receiveBound([...up.growing], now, up.task.pieceSize);
    if (bound) expected = Math.min(expected, bound.rate);
  }
  return farBelowReference(peer, expected) ? expected : Infinity;
}

/** What the parent would feed a chain child: its pace (expectedPace), within its room. */
export function offerTo(parent: Peer, child: Peer, now: number): number {
  return Math.min(expectedPace(parent, now), roomOf(parent, child) ?? Infinity);
}

/** Upload a rider (slowFeeder) finds at the parent: none under a chain's feeder, else the parent's pace less its other riders'. */
function spareFor(parent: Peer, rider: Peer): number {
  if (chainChildren(parent, rider).length > 0) return 0;
  let used = 0;
  for (const child of parent.children) if (child !== rider) used += takes(parent, child);
  return Math.max(0, (paceOf(parent) ?? Infinity) - used);
}

/**
 * The spare upload a rider needs at a parent. A passenger: its download's cap, raised by the
 * margin that clears a cap (LinkKnowledge.sawIntake) and once more by SLOW (what a rider gets
 * falls short of the spare it was placed by), so that a cap found too low, in a storm of moves or
 * while its download was shared, is found wrong where it rides; but no more than SLOW of the
 * reference, which a node's whole upload may fall short of (32 nodes at 20/10/2 Mbit/s: a
 * 10 Mbit/s passenger needing 20.4 Mbit/s fitted under no node). Simulated, 1000 nodes: a 5 Gbit/s
 * node capped at 3 Gbit/s rode where it got no more, and ended at 2.1 of its bound; placed by
 * 1/SLOW only, a 50 Gbit/s node capped at 3.2 received 4.5, short of clearing, and ended at 5.6.
 * One slow only to upload: SLOW of the parent's pace, up to the reference.
 */
function riderNeeds(parent: Peer, rider: Peer): number {
  const cap = passengerCap(rider);
  if (cap !== undefined) return Math.min(cap / SLOW / SLOW, SLOW * rider.task.adaptive.referenceRate);
  return SLOW * Math.min(paceOf(parent) ?? Infinity, rider.task.adaptive.referenceRate || Infinity);
}

/** The rider finds the spare upload it needs at the parent (riderNeeds). */
export function riderFits(parent: Peer, rider: Peer): boolean {
  return spareFor(parent, rider) >= riderNeeds(parent, rider);
}

/**
 * The parent can take the child: a passenger, where it finds spare upload for its cap; a chain
 * child, at a parent that feeds chains and has a free chain slot or room for it.
 */
export function canTake(parent: Peer, child: Peer, config: SchedulingConfig): boolean {
  if (slowFeeder(child)) return riderFits(parent, child);
  if (slowFeeder(parent)) return false;
  const chains = chainChildren(parent, child);
  if (chains.length < (parent.isSeed ? config.pipeline.seedFanout : config.pipeline.fanout)) return true;
  // A seed's room counts each chain at the reference, which its own chains set: one chain more at a time (seedTakesByRoom).
  if (parent.isSeed && !seedTakesByRoom(chains)) return false;
  const room = roomOf(parent, child);
  return room !== undefined && room >= SLOW * takes(parent, child);
}

/**
 * A seed takes a chain child by its room only once every chain child it has was measured. Its
 * room counts each chain at the task's reference, the most a node was measured to receive, and at
 * a swarm's start that is what the seed's own first chains received. On the emulated cluster (32
 * nodes starting at one gate, on a busy machine) the seed, its room read from one slow early
 * measurement, took some twenty waiting nodes as chain children at once; each received a share of
 * its link, so the reference stayed a share and the room stayed large: the seed sent 12–17 copies
 * and the fast nodes ended at 3.5–4.4 of their own bound. Taken one at a time, each chain shows
 * what it gets before the next is added.
 */
function seedTakesByRoom(chains: Peer[]): boolean {
  return chains.every((chain) => chain.pace.feedRate !== undefined);
}

/** What the child receives now: its feed rate, or less if what arrives now bounds it lower. */
export function receiving(child: Peer): number | undefined {
  const arrival = child.pace.slowArrival;
  const bound = arrival && arrival.since >= child.parentsSince ? arrival.rate : undefined;
  const feed = child.pace.feedRate;
  if (feed === undefined) return bound;
  return bound === undefined ? feed : Math.min(feed, bound);
}

/**
 * The child may be better off elsewhere: a chain child whose parent feeds no chain, or that is
 * held back (heldBack); a rider sharing a chain feeder's upload, or finding less spare than it
 * needs (riderNeeds: its parent slowed, or took riders since).
 */
export function misplaced(child: Peer, parent: Peer): boolean {
  if (slowFeeder(child)) return chainChildren(parent, child).length > 0 || !riderFits(parent, child);
  if (slowFeeder(parent)) return true;
  const now = receiving(child);
  return now !== undefined && heldBack(child, now);
}

/**
 * Candidates best first for the child. A chain child: the one that feeds it fastest (offers within
 * a factor 1/SLOW count as equal, so topology and the other scores decide among them). A
 * passenger: the slowest that still feeds it at its cap, so faster ones keep their room.
 */
export function rankForChild(child: Peer, candidates: Peer[], now: number, tieBreak: (p: Peer) => number): Peer[] {
  const cap = passengerCap(child);
  const bucket = (rate: number) => (rate === Infinity ? Infinity : Math.floor(Math.log(Math.max(rate, 1e-9)) / -Math.log(SLOW)));
  const keyed = candidates.map((peer) => {
    let key: number;
    if (cap === undefined) key = bucket(offerTo(peer, child, now));
    else {
      const pace = paceOf(peer) ?? Infinity;
      key = pace * SLOW >= cap ? 1e6 - bucket(pace) : bucket(pace); // the slowest that feeds it at its cap, else the fastest
    }
    return { peer, key, score: tieBreak(peer) };
  });
  keyed.sort((a, b) => b.key - a.key || b.score - a.score || a.peer.id.localeCompare(b.peer.id));
  return keyed.map((k) => k.peer);
}

/** How deep each running chain child is below the top of its chain (riders end chains: depth 0). */
function chainDepths(seed: Peer): { depthOf: (peer: Peer) => number; deepest: Peer | undefined } {
  const depth = new Map<Peer, number>();
  const depthOf = (peer: Peer): number => {
    const known = depth.get(peer);
    if (known !== undefined) return known;
    depth.set(peer, 0); // a guard against a stale edge looping
    const above = peer.parents[0];
    const d = above && !slowFeeder(peer) ? depthOf(above) + 1 : 0;
    depth.set(peer, d);
    return d;
  };
  let deepest: Peer | undefined;
  for (const peer of seed.task.peers.values()) {
    if (peer.state !== 'running' || slowFeeder(peer)) continue;
    if (!deepest || depthOf(peer) > depthOf(deepest)) deepest = peer;
  }
  return { depthOf, deepest };
}

/** `above` is above `peer` in its chain (a seed, or any chain peer), or is it. */
function feeds(above: Peer, peer: Peer): boolean {
  for (let up: Peer | undefined = peer; up; up = up.parents[0]) if (up === above) return true;
  return false;
}

/**
 * While no node that was not found slow has been measured (the task's reference unconfirmed), and
 * a chain child of the seed was found slow against it: is that child slow, or is every node? The
 * seed takes chain ends, the deepest first, up to MAX_PROBES in all (a chain's end costs nobody
 * below it a piece's overlap to move; cutting chains in the middle to probe several at once was
 * tried: simulated, 32 even nodes took 1.53 × T* instead of 1.08): they show what a node
 * receives within a piece time, unless they are slow too. Taken while the seed has measured
 * upload beyond what its children found slow take. None without a slow chain child: a seed no
 * faster than its nodes would split its link for nothing. Chains the seed took by its room
 * (canTake) answer the same question and count as probes: on the emulated cluster (32 × 10 Mbit/s,
 * a 40 Mbit/s seed) nodes that joined late took two or three such chains, the probes three more,
 * and five to seven chains shared the seed at 5.7–8 Mbit/s each until the end (last node 1.52 × T*).
 */
export function probeTargets(seed: Peer): Peer[] {
  const state = seed.task.adaptive;
  if (state.referenceConfirmed) return [];
  const children = chainChildren(seed);
  const tried = Math.max(state.probes.length, children.length - 1);
  if (tried >= MAX_PROBES) return [];
  if (!children.some((child) => child.host.links.downCap !== undefined)) return [];
  const upload = uploadEstimate(seed);
  let used = 0;
  for (const child of children) used += child.host.links.downCap ?? 0;
  if (upload === undefined || upload <= used) return [];
  const targets: Peer[] = [];
  const { depthOf } = chainDepths(seed);
  const ends = [...seed.task.peers.values()].filter(
    (peer) => peer.state === 'running' && !slowFeeder(peer) && peer.children.size === 0 && depthOf(peer) >= 2,
  );
  ends.sort((a, b) => depthOf(b) - depthOf(a) || a.id.localeCompare(b.id));
  for (const end of ends) {
    if (targets.length + tried >= MAX_PROBES) break;
    if (!feeds(end, seed)) targets.push(end);
  }
  return targets;
}

/**
 * A parent feeding more chains than its upload carries at their pace: each gets less than SLOW of
 * the parent's pace (and of the reference), and together they take its upload whole. A node takes
 * a chain more while its own pace is low (its room reads large), and keeps it when its chain
 * above speeds up; a seed keeps the chains it probed with. Its slowest chain moves below the end
 * of another (cut-through relay costs a chain little per hop): fewer chains, each faster.
 * Simulated, 32 nodes at 20/10/2 Mbit/s under a 40 Mbit/s seed: four seed chains at 10 Mbit/s or
 * less, and a node feeding three, held 20 Mbit/s nodes at the pace of 10 Mbit/s ones, and hid
 * those (no slower than their chains) until the chains sped up. Returns the chain child to move
 * and the chain ends it may go under, fastest first.
 */
export function chainToMerge(parent: Peer): { child: Peer; ends: Peer[] } | undefined {
  const state = parent.task.adaptive;
  if (!state.referenceConfirmed || slowFeeder(parent)) return undefined;
  const chains = chainChildren(parent).filter((child) => child.state === 'running');
  const upload = uploadEstimate(parent);
  if (chains.length < 2 || upload === undefined) return undefined;
  const pace = Math.min(paceOf(parent) ?? Infinity, state.referenceRate || Infinity);
  if (!Number.isFinite(pace) || upload / chains.length >= SLOW * pace) return undefined;
  let taken = 0;
  let slowest: { child: Peer; rate: number } | undefined;
  for (const child of chains) {
    const rate = receiving(child);
    if (rate === undefined) return undefined; // not measured yet: the upload's share is not known
    taken += rate;
    if (!slowest || rate < slowest.rate) slowest = { child, rate };
  }
  // Its chains do not take the upload whole: something else holds them back.
  if (!slowest || taken < SLOW * upload) return undefined;
  const { child, rate } = slowest;
  const ends: Array<{ peer: Peer; pace: number }> = [];
  for (const peer of parent.task.peers.values()) {
    if (peer.state !== 'running' || slowFeeder(peer) || chainChildren(peer).length > 0 || feeds(child, peer)) continue;
    const endPace = paceOf(peer);
    if (endPace !== undefined && endPace >= SLOW * rate) ends.push({ peer, pace: endPace });
  }
  ends.sort((a, b) => b.pace - a.pace || a.peer.id.localeCompare(b.peer.id));
  return ends.length > 0 ? { child, ends: ends.map((end) => end.peer) } : undefined;
}

/**
 * The chains below each running chain peer of a task, from one pass: how many chain peers its
 * longest chain below holds, and whether a room trial (adaptive.ts tryRoom) runs at a peer above
 * it or below it. Memoized per peer (recursive, as chainDepths); riders and peers that left hold no chain.
 */
export interface ChainsBelow {
  /** The middle of the longest chain below `peer`, if it is at least four long (halving it), else undefined. */
  middle(peer: Peer): Peer | undefined;
  /** A room trial runs at a peer above `peer`, or below it: a trial of its own would be judged on rates the other moves. */
  nearTrial(peer: Peer): boolean;
}

export function chainsBelow(task: Task): ChainsBelow {
  const trials = task.adaptive.roomTrials;
  const heights = new Map<Peer, { height: number; via: Peer | undefined; trialBelow: boolean }>();
  const below = (peer: Peer): { height: number; via: Peer | undefined; trialBelow: boolean } => {
    const known = heights.get(peer);
    if (known) return known;
    const result = { height: 0, via: undefined as Peer | undefined, trialBelow: false };
    heights.set(peer, result); // a guard against a stale edge looping
    for (const child of chainChildren(peer)) {
      if (child.state !== 'running' || child.parents[0] !== peer) continue;
      const next = below(child);
      if (next.height + 1 > result.height) Object.assign(result, { height: next.height + 1, via: child });
      if (next.trialBelow || trials.has(child)) result.trialBelow = true;
    }
    return result;
  };
  const above = new Map<Peer, boolean>();
  const trialAbove = (peer: Peer): boolean => {
    const known = above.get(peer);
    if (known !== undefined) return known;
    above.set(peer, false);
    const parent = peer.parents[0];
    const found = parent !== undefined && (trials.has(parent) || trialAbove(parent));
    above.set(peer, found);
    return found;
  };
  return {
    middle: (peer) => {
      const { height } = below(peer);
      if (height < 4) return undefined;
      let chosen: Peer | undefined = peer;
      for (let i = 0; i < height - Math.floor(height / 2) && chosen; i++) chosen = below(chosen).via;
      return chosen;
    },
    nearTrial: (peer) => below(peer).trialBelow || trialAbove(peer),
  };
}

/**
 * A peer whose upload may carry one chain more than it feeds, though nothing measured shows it:
 * what it was seen to receive and send is only what its chains took (a seed reading the origin
 * slower than its nodes receive, a node on a link several times the chain's pace), so its room
 * reads as none. Every chain it feeds runs at its pace (so it is not full already), its upload was
 * never found full (LinkKnowledge.upCap), and the reference is confirmed. Returns the peer to try
 * it with: the middle of its longest chain below (see chainToSplit; simulated, 1000 nodes at
 * 50 Gbit/s under a 25 Gbit/s registry fed through one chain of the seed ended at a median of
 * 1.39 × their own bound, through three at 1.17).
 */
export function roomToTry(peer: Peer, chains: ChainsBelow): Peer | undefined {
  const state = peer.task.adaptive;
  const links = peer.host.links;
  if (!state.referenceConfirmed || links.upCap !== undefined || slowFeeder(peer)) return undefined;
  const pace = paceOf(peer);
  if (pace === undefined || !Number.isFinite(pace)) return undefined;
  const room = roomOf(peer);
  if (room !== undefined && room >= SLOW * pace) return undefined; // known: chainToSplit and canTake use it
  const children = chainChildren(peer);
  if (links.uploadLimit !== undefined && links.uploadLimit < (children.length + 1) * pace * SLOW) return undefined;
  for (const child of children) {
    const gets = receiving(child);
    if (gets === undefined || gets < SLOW * pace) return undefined;
  }
  return chains.middle(peer);
}

/**
 * The peer a seed with room for a whole chain more takes (no cycle): the middle of the longest
 * chain, if that chain is at least four long and its middle is held back far below the
 * reference, which halves it (a chain finds its slow peers one after another, as each part of it
 * gets faster; halves find theirs in parallel). Not a chain that runs at the reference: moving a
 * peer costs its chain a piece's overlap.
 */
export function chainToSplit(seed: Peer): Peer | undefined {
  const chosen = chainsBelow(seed.task).middle(seed);
  const gets = chosen && receiving(chosen);
  if (!chosen || gets === undefined || !heldBack(chosen, gets)) return undefined;
  return chosen;
}
