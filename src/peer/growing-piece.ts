/**
 * A piece whose bytes are arriving (from a parent or from the origin) and are not stored yet.
 * The upload server relays such bytes to children as they come in (cut-through), so a piece
 * crosses a chain of peers in about one piece time rather than one piece time per hop. The
 * fetch that fills the buffer calls `advance` as bytes land and `end` once the piece is stored
 * or the fetch gave up, whichever happens.
 */
export class GrowingPiece {
  /** Bytes of `buffer` filled so far, from its start. */
  filled = 0;
  private finished = false;
  private waiters: Array<{ seen: number; wake: () => void }> = [];

  constructor(
    readonly index: number,
    readonly buffer: Buffer,
    private readonly onEnd: (piece: GrowingPiece) => void,
    /**
     * Read from the origin itself: its bytes are as good as a direct pull's as they arrive, so a
     * mirror client may have them before the piece is stored. A parent's bytes are not: they are
     * checked against the piece digest only once the piece is whole.
     */
    readonly fromOrigin = false,
  ) {}

  /** The fetch has ended (stored, or given up: then `filled` may be short of the buffer). */
  get ended(): boolean {
    return this.finished;
  }

  advance(filled: number): void {
    if (this.finished || filled <= this.filled) return;
    this.filled = filled;
    this.wake();
  }

  end(): void {
    if (this.finished) return;
    this.finished = true;
    this.onEnd(this);
    this.wake();
  }

  /** Resolves once more than `seen` bytes are there, or the fetch has ended. */
  next(seen: number): Promise<void> {
    if (this.finished || this.filled > seen) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push({ seen, wake: resolve }));
  }

  private wake(): void {
    if (this.waiters.length === 0) return;
    const waiting = this.waiters;
    this.waiters = [];
    for (const waiter of waiting) {
      if (this.finished || this.filled > waiter.seen) waiter.wake();
      else this.waiters.push(waiter);
    }
  }
}
