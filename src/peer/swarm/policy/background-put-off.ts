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

/**
 * The longest background pieces wait while the scheduler says the registry's swarm reads on demand
 * (SwarmReading): a scheduler lost before it said the reads ended, or starts that never pause,
 * must not keep caches from filling for ever.
 */
export const SWARM_READING_HOLD_MAX_MS = 60_000;

/**
 * Whether pieces only background readers want wait for the swarm: the scheduler said at
 * `readingSinceMs` (undefined: it did not, or said the reads ended) that peers of the registry
 * fetch pieces workloads wait for. The seed's own children are one part of the swarm; once nodes
 * read from each other the seed hears nothing, and early nodes' background fetches would reach
 * the registry while the last ones start (3.7 copies of the needed bytes, 8 nodes at 25 Mbit/s).
 */
export function waitsForSwarm(readingSinceMs: number | undefined, nowMs: number): boolean {
  return readingSinceMs !== undefined && nowMs - readingSinceMs < SWARM_READING_HOLD_MAX_MS;
}

/** Whether the seed puts this piece off now; a child downloading the whole blob is never put off. */
export function putsBackgroundOff(wish: PieceWish, lastDemandAtMs: number, nowMs: number, swarmReadingSinceMs?: number): boolean {
  if (!wish.background || wish.wholeBlob) return false;
  return nowMs - lastDemandAtMs < BACKGROUND_QUIET_MS || waitsForSwarm(swarmReadingSinceMs, nowMs);
}
