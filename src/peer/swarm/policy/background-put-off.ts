/**
 * When a seed fetching pieces on demand puts a background piece off. Nodes that start one lazily
 * pulled image together read what their workloads need for tens of seconds; those that start
 * first then fill their caches in the background. Fetched from the registry at once, those
 * background pieces would share the registry's link with the reads the other nodes wait for, and
 * the registry would send several times the bytes the starts need (8 nodes end to end: 2.76
 * copies of them with background fetch, 1.48 without). Put off until the seed's children have
 * quietened, they come from what the others read, and from the registry only after.
 */
import type { PieceWish } from '../../../rpc/upload-api.js';

/**
 * How long since a child last asked for a piece a workload waits for, before background pieces
 * are fetched: longer than the pause between one layer's mount and the next (a second or two).
 */
export const BACKGROUND_QUIET_MS = 3_000;

/** Whether the seed puts this piece off now; a child downloading the whole blob is never put off. */
export function putsBackgroundOff(wish: PieceWish, lastDemandAtMs: number, nowMs: number): boolean {
  return wish.background && !wish.wholeBlob && nowMs - lastDemandAtMs < BACKGROUND_QUIET_MS;
}
