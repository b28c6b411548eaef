import type { PieceLayout } from '../../storage/piece-plan.js';
import type { GrowingPiece } from '../growing-piece.js';

/** Where a piece's bytes came from; the peer's metrics and `starling stat` count bytes by this. */
export type PieceOrigin = 'origin' | 'peer' | 'seed';

/** A contiguous run of pieces, inclusive. */
export interface PieceRun {
  first: number;
  last: number;
}

/** Where one piece came from, as recorded with it and reported to the scheduler. */
export interface PieceProvenance {
  from: PieceOrigin;
  /** The parent peer it came from (swarm sources). */
  parentId?: string;
  /** sha256 hex of the bytes, when the source already computed it while verifying. */
  sha256?: string;
  /** Milliseconds the transfer took, for the scheduler's view of its parents. */
  costMs?: number;
}

/**
 * Receives pieces from a source, in any order; a source may also deliver pieces outside the run
 * it was asked for (an origin that ignored Range sends everything).
 */
export type PieceSink = (index: number, bytes: Buffer, provenance?: Partial<PieceProvenance>) => Promise<void>;

/** Hands out the buffer a piece is read into, so its bytes can be relayed while they arrive. */
export type PieceBuffers = (index: number) => GrowingPiece;

/**
 * Anything pieces can be fetched from: the origin registry now; parents and seeds in a swarm.
 * fetchRun resolves once every piece of the run was handed to the sink, or rejects.
 */
export interface PieceSource {
  readonly kind: PieceOrigin;
  readonly description: string;
  fetchRun(layout: PieceLayout, run: PieceRun, sink: PieceSink, signal?: AbortSignal, buffers?: PieceBuffers): Promise<void>;
}

/** An origin's HTTP answer that the client should see as it is (401 with its challenge, 403, 404). */
export class UpstreamStatusError extends Error {
  override name = 'UpstreamStatusError';
  constructor(
    readonly status: number,
    readonly headers: Record<string, string>,
    readonly body: string,
    message: string,
  ) {
    super(message);
  }
}

/**
 * The origin's answer contradicts the blob's size as recorded when its task was created (from a
 * HEAD): one of the two is wrong, and a blob of the wrong size never verifies. The task is
 * dropped rather than retried, so the next request asks the origin afresh.
 */
export class BlobSizeMismatchError extends Error {
  override name = 'BlobSizeMismatchError';
}
