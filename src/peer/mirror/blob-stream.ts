import type { ServerResponse } from 'node:http';
import type { Logger } from '../../common/log.js';
import { sendFileRange } from '../../common/sendfile.js';
import { pieceBounds, piecesCovering } from '../../storage/piece-plan.js';
import type { BlobTask } from '../blob-task.js';
import type { ByteRange } from '../http-range.js';
import type { PeerMetrics } from '../metrics.js';
import { pieceBuffers } from '../piece-buffers.js';
import { ClientGoneError, writeChunk } from './respond.js';

/** Bytes read from disk per write to a client: large enough for throughput, small enough for memory. */
const READ_CHUNK = 1024 * 1024;
/** Bytes of a piece still arriving that are gathered before they are relayed to a client. */
const RELAY_CHUNK = 256 * 1024;

/** What one response may be sent of a blob's bytes, and from where. */
export interface StreamPlan {
  /**
   * The whole blob: its last bytes wait for the digest check, so a blob whose bytes are wrong
   * never reaches the client complete, and every stored byte may go out before that.
   */
  whole: boolean;
  /** Pieces this request's own fetch brings (BlobTask.request): they go to it as they arrive. */
  fetchedForThis: ReadonlySet<number>;
  /**
   * Sends bytes [start, end] read again from the registry the client names: for a range whose
   * stored bytes were not verified yet and were not fetched for this request (a later request is
   * never served bytes that did not verify).
   */
  fromRegistry(start: number, end: number): Promise<void>;
  /**
   * Pieces of which the range needs a part, read as spans (piece-spans.ts): those bytes once
   * there, by piece, or undefined if the span could not be read.
   */
  spans: ReadonlyMap<number, Promise<Buffer | undefined>>;
  /** Fetches a piece whole for this request (its span could not be read). */
  fetchWhole(index: number): void;
}

export function coveringPieces(task: BlobTask, range: ByteRange): [number, number] {
  const { first, last } = piecesCovering(task.layout, range.start, Math.max(range.start, range.end));
  return [first, last];
}

/** Sends ranges of a blob to a client as their pieces become available: from memory, disk, or as they arrive. */
export class BlobStreamer {
  constructor(private readonly deps: { metrics: PeerMetrics; log: Logger }) {}

  /** Sends bytes [start, end] of `task` (whose covering pieces have been requested) as `plan` allows. */
  async stream(res: ServerResponse, task: BlobTask, range: ByteRange, plan: StreamPlan): Promise<void> {
    if (range.end < range.start) {
      // A zero-byte blob: nothing to send, but it must still have been verified.
      await task.waitForPiece(0);
      if (plan.whole) await task.whenVerified();
      return;
    }
    const [first, last] = coveringPieces(task, range);
    for (let index = first; index <= last; index++) {
      const bounds = pieceBounds(task.layout, index);
      let position = Math.max(range.start, bounds.offset);
      const stop = Math.min(range.end, bounds.offset + bounds.length - 1);
      const spanRead = plan.spans.get(index);
      if (spanRead) {
        const span = await spanRead;
        if (span) {
          await writeChunk(res, span);
          this.deps.metrics.servedBytes.inc(span.length);
          this.deps.metrics.spanBytes.inc(span.length);
          continue;
        }
        plan.fetchWhole(index);
      }
      const holdForVerification = plan.whole && index === task.layout.pieceCount - 1;
      const own = plan.whole || plan.fetchedForThis.has(index);
      if (!own && !task.pieceServable(index)) {
        // Another request's fetch brings this piece, or brought it unverified: verified bytes only.
        await task.waitForPiece(index);
        if (!task.pieceServable(index)) {
          await plan.fromRegistry(position, stop);
          this.deps.metrics.unverifiedRangeBytes.inc(stop - position + 1);
          continue;
        }
      }
      if (own && !holdForVerification) position = await this.relayFromOrigin(res, task, index, position, stop);
      if (position > stop) continue;
      await task.waitForPiece(index);
      if (holdForVerification) await task.whenVerified();
      const inMemory = task.recentPiece(index);
      if (!inMemory && task.complete && (await this.sendFromDisk(res, task, position, range.end))) return;
      if (inMemory) {
        // Just arrived: send it from memory rather than reading it back from disk.
        pieceBuffers.hold(inMemory);
        await writeChunk(res, inMemory.subarray(position - bounds.offset, stop - bounds.offset + 1), () => pieceBuffers.release(inMemory));
        this.deps.metrics.servedBytes.inc(stop - position + 1);
        continue;
      }
      await this.sendStored(res, task, position, stop);
    }
  }

  /** Sends stored bytes [position, stop] through buffers, reading the next chunk while the current one goes out. */
  private async sendStored(res: ServerResponse, task: BlobTask, position: number, stop: number): Promise<void> {
    const readAt = async (at: number): Promise<Buffer> => {
      const length = Math.min(READ_CHUNK, stop - at + 1);
      const buffer = Buffer.allocUnsafe(length);
      const read = await task.blob.read(buffer, at, length);
      if (read !== length) throw new Error(`short read of ${task.digest} at ${at}`);
      return buffer;
    };
    let next: Promise<Buffer> | undefined = readAt(position);
    try {
      while (next) {
        const buffer: Buffer = await next;
        position += buffer.length;
        next = position <= stop ? readAt(position) : undefined;
        await writeChunk(res, buffer);
        this.deps.metrics.servedBytes.inc(buffer.length);
      }
    } finally {
      next?.catch(() => {}); // the client left: the read under way has no one to go to
    }
  }

  /**
   * Sends bytes [position, stop] of piece `index` as they arrive from the origin, before the
   * piece is stored (bytes from parents wait for their piece check). Returns the position reached:
   * the rest is sent from the store once the piece is there.
   */
  private async relayFromOrigin(res: ServerResponse, task: BlobTask, index: number, position: number, stop: number): Promise<number> {
    const { offset } = pieceBounds(task.layout, index);
    while (position <= stop) {
      // Sizeable writes: a write per arriving packet would cost a system call each.
      const want = Math.min(position + RELAY_CHUNK, stop + 1) - offset;
      const growing = await task.waitForOriginBytes(index, want - 1);
      if (!growing) break; // stored: the rest goes from the store
      const end = Math.min(growing.filled + offset, stop + 1);
      // The buffer came held for us; the write lets go of it.
      await writeChunk(res, growing.buffer.subarray(position - offset, end - offset), () => pieceBuffers.release(growing.buffer));
      this.deps.metrics.servedBytes.inc(end - position);
      position = end;
    }
    return position;
  }

  /** Sends [start, end] of a verified blob straight from disk with sendfile(2), when it can. */
  private async sendFromDisk(res: ServerResponse, task: BlobTask, start: number, end: number): Promise<boolean> {
    const count = end - start + 1;
    const sent = await sendFileRange(res, task.blob.dataFd, start, count).catch((error: Error) => {
      this.deps.log.debug({ digest: task.digest, err: error.message }, 'sendfile stopped');
      throw new ClientGoneError();
    });
    if (sent) {
      this.deps.metrics.servedBytes.inc(count);
      this.deps.metrics.sendfileBytes.inc(count);
    }
    return sent;
  }
}
