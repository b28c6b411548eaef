import { busyBackoffMs } from './busy-backoff.js';

/** Weight of the newest piece in a parent's rate: a few pieces' memory, so a slowdown shows within about three pieces. */
const NEWEST_PIECE_WEIGHT = 0.3;

/** How fast a parent serves this child, learned from the pieces it sent, and what that means for waiting on it. */
export class ParentPace {
  /** Bytes per millisecond, a moving average over finished pieces; 0 before the first. */
  rate = 0;
  /** The length of the last piece this parent sent (what a 429's wait is measured against). */
  private pieceBytes = 0;
  /** 429s it answered since it last served a piece. */
  private busyInARow = 0;

  /** A piece of `bytes` came from the parent in `elapsedMs` (request to last byte). */
  pieceServed(bytes: number, elapsedMs: number): void {
    const rate = bytes / Math.max(1, elapsedMs);
    this.rate = this.rate === 0 ? rate : (1 - NEWEST_PIECE_WEIGHT) * this.rate + NEWEST_PIECE_WEIGHT * rate;
    this.pieceBytes = bytes;
    this.busyInARow = 0;
  }

  /** The parent answered 429: how long to leave it alone (busyBackoffMs). */
  answeredBusy(): number {
    this.busyInARow++;
    return busyBackoffMs(this.pieceBytes, this.rate, this.busyInARow);
  }
}
