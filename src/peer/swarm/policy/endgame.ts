/**
 * When a piece on its way gets a second parent. At the tail of a download the last pieces can
 * hang on one slow parent, so they are asked of another too and the first answer wins. But a
 * second copy shares this peer's downlink with the first: asked too eagerly it wastes the very
 * bandwidth the tail needs. (Before this rule the peer doubled every piece in flight whenever
 * its parents had nothing new for it; on a 32-node, 10 Mbit/s cluster the simulator counted 13
 * copies' worth of bytes thrown away for 32 delivered.)
 */

import type { ParentView } from './parent-choice.js';

/** A piece is not a straggler before it has been on its way this long. */
export const ENDGAME_AFTER_MS = 500;

/** A piece is a straggler when it arrives this many times slower than the other parent serves. */
export const ENDGAME_SLOWER = 4;

/**
 * Whether a piece on its way from one parent should also be asked of another. Called only at
 * the tail, when every other wanted piece is stored or on its way (so no more useful transfer
 * could use the downlink). Yes after ENDGAME_AFTER_MS if the bytes so far come ENDGAME_SLOWER
 * times slower than the other parent's measured rate (bytes per millisecond). A parent that has
 * served this peer nothing yet is expected to serve as fast as the fastest parent did
 * (`fastestServed`): a child the scheduler moves to a parent holding the whole blob near its tail
 * asks that parent for nothing before the endgame, and without this its last piece hung on the
 * slow parent it had asked long before (simulated, a 20 Mbit/s node waited 48 s for a piece a
 * 2 Mbit/s node relayed as it received it). When no parent has served anything, the answer is
 * no: a parent that sends nothing at all is given up by the stall timeout instead.
 */
export function wantsSecondParent(
  attempt: { receivedBytes: number; elapsedMs: number },
  otherParentRate: number,
  fastestServed = 0,
): boolean {
  const expected = otherParentRate > 0 ? otherParentRate : fastestServed;
  if (attempt.elapsedMs < ENDGAME_AFTER_MS || !(expected > 0)) return false;
  return (attempt.receivedBytes / attempt.elapsedMs) * ENDGAME_SLOWER < expected;
}

/**
 * A piece from a replaced parent is given up only when it also arrives at least this many times
 * slower than that parent served: the test on the time left alone gives up a piece that came at
 * 0.7 of the usual pace a third of the way in, and emulated chains, whose rates dip while the
 * machine is busy, lost such pieces down the chain (one run of set-up S: 1.58 / 1.80 of the own
 * bound against 1.25 / 1.32 under a 4-times-slower rule; docs/benchmarks.md, "Uneven clusters").
 */
export const RETIRED_SLOWER = 2;

/**
 * What the fastest chain parent offering piece `index` serves (bytes per millisecond; 0 if none):
 * the pace expected of a piece from a replaced parent that served nothing (dropsWithRetiredParent).
 * Chain parents only, those that give one piece at a time: below them a piece stuck upstream holds
 * every peer, each waiting for its one piece; where parents give several at once (the mesh) the
 * other pieces go on meanwhile, and the tail's endgame doubles a straggler instead of throwing it
 * away. (Counting every parent, the simulated mesh of 32 nodes threw 3.4 copies away against
 * under 1.)
 */
export function chainParentsServe(parents: Iterable<Pick<ParentView, 'piecesAtOnce' | 'offers' | 'rate'>>, index: number): number {
  let fastest = 0;
  for (const parent of parents) if (parent.piecesAtOnce === 1 && parent.offers(index)) fastest = Math.max(fastest, parent.rate);
  return fastest;
}

/**
 * Whether a piece on its way from a parent the scheduler replaced is given up, to be asked of the
 * new parents. The scheduler moves a child off a parent that slowed down; a piece left to finish
 * from it arrives at the slowed pace, and in a chain every peer below relays that same piece, one
 * at a time: the simulator showed 8 peers below a node cut to a tenth of its rate waiting 45 s on
 * one 4 MiB piece after their chain had been moved (docs/benchmarks.md, "Uneven clusters"). Yes,
 * after ENDGAME_AFTER_MS, when the rest of the piece at its pace so far would take longer than the
 * whole piece at the pace expected, and the piece comes RETIRED_SLOWER times slower than that
 * (bytes per millisecond). Expected: what the retired parent served before; if it served nothing,
 * what the fastest chain parent offering the piece now serves (`parentsServe`, chainParentsServe);
 * with neither, no: nothing says the piece is late. (Judged only by the retired parent, a piece
 * from one that had served nothing was kept, and a dozen 20 Mbit/s nodes below relayed it at a
 * 2 Mbit/s node's pace for 30 s, each allowed one piece at a time by its parent: simulated, 32
 * nodes at 20/10/2 Mbit/s. Judged by the fastest any parent ever served, nodes once fed by a seed gave up pieces
 * that came at their chain's pace.) A piece arriving at the expected pace, or nearly done,
 * finishes: cutting it would throw its bytes away for nothing.
 */
export function dropsWithRetiredParent(
  attempt: { receivedBytes: number; elapsedMs: number; length: number },
  retiredParentRate: number,
  parentsServe = 0,
): boolean {
  const expected = retiredParentRate > 0 ? retiredParentRate : parentsServe;
  if (attempt.elapsedMs < ENDGAME_AFTER_MS || !(expected > 0)) return false;
  if (attempt.receivedBytes * RETIRED_SLOWER > expected * attempt.elapsedMs) return false;
  const rest = Math.max(0, attempt.length - attempt.receivedBytes);
  // rest / pace > length / expected, with pace = receivedBytes / elapsedMs (0 allowed).
  return rest * attempt.elapsedMs * expected > attempt.length * attempt.receivedBytes;
}
