/**
 * How long a parent that answered 429 (every upload slot busy) is left alone. Its slots free up
 * at the pace its pieces go out, so the wait is about one piece's time from that parent: a fixed
 * 250 ms suits links where a 4 MiB piece takes seconds, but where a 32 MiB piece takes 5 ms it
 * idles the link for 50 pieces' worth (simulated 1000-node lazy start: 6.1-6.7 x T* with the
 * fixed wait, 3.9-4.9 x with this one). Slow links keep the 250 ms, the bound.
 */

/** The longest wait. */
export const BUSY_BACKOFF_MAX_MS = 250;
/** The shortest wait: a retry sooner would mostly meet the same busy slots. */
export const BUSY_BACKOFF_MIN_MS = 10;

/**
 * The wait after a 429, given a piece's length, the parent's measured rate in bytes per
 * millisecond, and how many 429s in a row it answered. While its pace is unknown (nothing served
 * yet) the wait doubles from the floor with each 429 up to the bound: a fixed 250 ms left a new
 * parent alone for 180 piece times at 50 Gbit/s, and a parent's slots held by children just moved
 * off it free up within a piece time or two.
 */
export function busyBackoffMs(pieceBytes: number, parentRate: number, busyInARow = 1): number {
  if (!(parentRate > 0) || !(pieceBytes > 0)) {
    return Math.min(BUSY_BACKOFF_MAX_MS, BUSY_BACKOFF_MIN_MS * 2 ** Math.max(0, Math.min(busyInARow - 1, 16)));
  }
  return Math.min(BUSY_BACKOFF_MAX_MS, Math.max(BUSY_BACKOFF_MIN_MS, pieceBytes / parentRate));
}
