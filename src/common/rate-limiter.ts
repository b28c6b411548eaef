import { setTimeout as sleep } from 'node:timers/promises';

/**
 * A token bucket shared by every transfer in one direction of one host. A rate of 0 means
 * unlimited. Callers take tokens before they move bytes, so a burst is at most one second's worth.
 */
export class RateLimiter {
  private tokens: number;
  private last = performance.now();
  private queue: Promise<void> = Promise.resolve();

  constructor(private readonly bytesPerSecond: number) {
    this.tokens = bytesPerSecond;
  }

  get unlimited(): boolean {
    return this.bytesPerSecond <= 0;
  }

  /** Resolves once `bytes` may be sent. Requests are served in order. */
  take(bytes: number): Promise<void> {
    if (this.unlimited) return Promise.resolve();
    const turn = this.queue.then(() => this.wait(bytes));
    this.queue = turn.catch(() => undefined);
    return turn;
  }

  private async wait(bytes: number): Promise<void> {
    this.refill();
    this.tokens -= bytes;
    if (this.tokens < 0) await sleep((-this.tokens / this.bytesPerSecond) * 1000);
  }

  private refill(): void {
    const now = performance.now();
    this.tokens = Math.min(this.bytesPerSecond, this.tokens + ((now - this.last) / 1000) * this.bytesPerSecond);
    this.last = now;
  }
}
