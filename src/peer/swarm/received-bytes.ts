import type { Received } from '../../rpc/scheduler-api.js';
import type { GrowingPiece } from '../growing-piece.js';

/**
 * What one download has received, for its Received reports (policy/received-report.ts): a running
 * total of bytes, pieces given up included (their bytes took the link too), and how much of each
 * piece on its way has arrived.
 */
export class ReceivedBytes {
  private readonly arriving = new Set<GrowingPiece>();
  private endedBytes = 0;

  /** A piece's bytes began to arrive (from a parent or the origin). */
  began(piece: GrowingPiece): void {
    this.arriving.add(piece);
  }

  /** What to report now; undefined while nothing is on its way (then there is nothing to judge). */
  report(): Received | undefined {
    const pieces: NonNullable<Received['pieces']> = [];
    let bytes = this.endedBytes;
    for (const piece of this.arriving) {
      if (piece.ended) {
        this.endedBytes += piece.filled;
        bytes += piece.filled;
        this.arriving.delete(piece);
        continue;
      }
      pieces.push({ index: piece.index, bytes: piece.filled });
      bytes += piece.filled;
    }
    return pieces.length > 0 ? { bytes, pieces } : undefined;
  }
}
