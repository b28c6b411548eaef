/**
 * When a download that makes no progress asks for help. Slow is not stuck: while pieces are on
 * their way the peer waits for them (a piece is given up only when no byte of it comes for the
 * piece timeout). Going back to the origin is the scheduler's call (it counts fruitless rounds);
 * the peer decides alone only when the scheduler seems to have forgotten it for a long time.
 */

/** How often a download checks its progress (and asks parents that were busy again). */
export const WATCHDOG_INTERVAL_MS = 1_000;

/**
 * With nothing stored and nothing on its way for this many stall periods (`stallMs`), the peer
 * reads the origin itself. Six since 5a46877 ("a slow transfer is not a stall; the scheduler
 * decides who goes back to the origin"), which moved that decision to the scheduler; two before.
 */
export const ORIGIN_AFTER_STALLS = 6;

/**
 * A piece attempt that ends without a piece (a 429, a missing piece, a failure) frees its fetch
 * slot, refilled this much later rather than at once: asking the same busy parents again at once
 * would mostly meet the same answer. (After a stored piece the slot is refilled at once: in a
 * pipeline every millisecond idle is lost by every peer down the chain.)
 */
export const RETRY_AFTER_FAILED_PIECE_MS = 20;

export type StallVerdict = 'wait' | 'reschedule' | 'origin';

/**
 * What a download does after `idleMs` with nothing stored: wait while pieces are on their way;
 * ask for new parents after `stallMs`; read the origin after ORIGIN_AFTER_STALLS × `stallMs`.
 * With no scheduler to ask (every one lost mid-download, the peer going on with the parents it
 * had), there is no one to give new parents: the origin after `stallMs`.
 */
export function stallVerdict(idleMs: number, stallMs: number, piecesOnTheirWay: number, schedulerReachable = true): StallVerdict {
  if (piecesOnTheirWay > 0) return 'wait';
  if (idleMs > ORIGIN_AFTER_STALLS * stallMs) return 'origin';
  if (idleMs > stallMs) return schedulerReachable ? 'reschedule' : 'origin';
  return 'wait';
}

/**
 * How often a piece on its way is checked for new bytes: a piece whose parent sends nothing for
 * `pieceTimeoutMs` is given up (a stall, not a slow piece: on a link shared by many transfers a
 * piece may take longer than any fixed bound, and restarting it only wastes what came so far).
 */
export function pieceCheckIntervalMs(pieceTimeoutMs: number): number {
  return Math.min(1_000, pieceTimeoutMs / 4);
}
