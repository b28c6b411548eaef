// Piece buffers, reused once nobody holds them.
//
// Why: V8 starts a full mark-compact after every few dozen MB of new ArrayBuffers, however little
// of them stays alive. A peer pulling 250 MB/s allocated a fresh 4 MiB buffer per piece and paid
// ~40 mark-compacts per GB for it, most of a CPU core's worth of GC work on its helper threads.
//
// The rule that keeps reuse safe: whoever uses a pooled buffer across an await holds it, and lets
// go only once nothing of it is in use any more (for a socket write: in the write's callback,
// when the kernel has the bytes). A holder that never lets go only costs the reuse: the buffer is
// then collected as any other. Subarrays are held through the buffer they were cut from.

/** Idle buffers kept per length (64 MiB of 4 MiB pieces). */
const IDLE_PER_LENGTH = 16;
/** Idle buffers are dropped when none was taken for this long, so a quiet peer holds no memory. */
const IDLE_KEEP_MS = 10_000;

export class PieceBufferPool {
  private readonly idle = new Map<number, Buffer[]>();
  private readonly holds = new WeakMap<Buffer, number>();
  private lastTake = 0;
  private trimTimer?: NodeJS.Timeout;
  /** Buffers handed out again rather than allocated (for tests and metrics). */
  reused = 0;

  constructor(private readonly idleKeepMs = IDLE_KEEP_MS) {}

  /** A buffer of `length` bytes (contents undefined), held once by the caller. */
  take(length: number): Buffer {
    this.lastTake = performance.now();
    const buffer = this.idle.get(length)?.pop();
    if (buffer) this.reused++;
    const taken = buffer ?? Buffer.allocUnsafe(length);
    this.holds.set(taken, 1);
    return taken;
  }

  /** One more holder of a buffer from `take` (anything else is ignored). */
  hold(buffer: Buffer): void {
    const count = this.holds.get(buffer);
    if (count !== undefined) this.holds.set(buffer, count + 1);
  }

  /** One holder fewer; the last one returns the buffer to the pool. */
  release(buffer: Buffer): void {
    const count = this.holds.get(buffer);
    if (count === undefined) return;
    if (count > 1) return void this.holds.set(buffer, count - 1);
    this.holds.delete(buffer);
    let idle = this.idle.get(buffer.length);
    if (!idle) this.idle.set(buffer.length, (idle = []));
    if (idle.length < IDLE_PER_LENGTH) idle.push(buffer);
    this.trimLater();
  }

  /** Idle buffers now (all lengths). */
  get idleCount(): number {
    let count = 0;
    for (const list of this.idle.values()) count += list.length;
    return count;
  }

  private trimLater(): void {
    if (this.trimTimer) return;
    this.trimTimer = setTimeout(() => {
      this.trimTimer = undefined;
      if (performance.now() - this.lastTake >= this.idleKeepMs) this.idle.clear();
      else this.trimLater();
    }, this.idleKeepMs);
    this.trimTimer.unref();
  }

  /** Holders of `buffer` now (0 when idle or not from this pool). */
  holders(buffer: Buffer): number {
    return this.holds.get(buffer) ?? 0;
  }
}

/** The peer process's pool. */
export const pieceBuffers = new PieceBufferPool();
