import type { PieceRun } from '../sources/piece-source.js';

interface RunWaiter {
  run: PieceRun;
  resolve: () => void;
  reject: (error: Error) => void;
}

/**
 * The pieces a download's clients asked for and the task does not hold yet, and the clients
 * waiting for runs of them. Told of every stored piece; once failed, it fails every waiter.
 */
export class WantedPieces implements Iterable<number> {
  private readonly wanted = new Set<number>();
  private readonly waiters: RunWaiter[] = [];
  private failure?: Error;

  constructor(private readonly held: (index: number) => boolean) {}

  get size(): number {
    return this.wanted.size;
  }

  /** Why the download gave up, once it has. */
  get failed(): Error | undefined {
    return this.failure;
  }

  [Symbol.iterator](): Iterator<number> {
    return this.wanted[Symbol.iterator]();
  }

  /** Adds the run's pieces the task does not hold; says whether any was new. */
  add(run: PieceRun): boolean {
    let added = false;
    for (let index = run.first; index <= run.last; index++) {
      if (!this.held(index) && !this.wanted.has(index)) {
        this.wanted.add(index);
        added = true;
      }
    }
    return added;
  }

  /** Wanted pieces the task still lacks, ascending. */
  missing(): number[] {
    return [...this.wanted].filter((index) => !this.held(index)).sort((a, b) => a - b);
  }

  /** A piece was stored: it is wanted no more, and clients whose run is now whole go on. */
  stored(index: number): void {
    this.wanted.delete(index);
    for (const waiter of [...this.waiters]) {
      if (this.whole(waiter.run)) {
        this.waiters.splice(this.waiters.indexOf(waiter), 1);
        waiter.resolve();
      }
    }
  }

  /** Resolves once every piece of the run is stored; rejects if the download gives up. */
  wait(run: PieceRun): Promise<void> {
    if (this.failure) return Promise.reject(this.failure);
    if (this.whole(run)) return Promise.resolve();
    return new Promise((resolve, reject) => this.waiters.push({ run, resolve, reject }));
  }

  /** The download gave up: every waiter, now and later, gets `error`. */
  fail(error: Error): void {
    if (this.failure) return;
    this.failure = error;
    for (const waiter of this.waiters.splice(0)) waiter.reject(error);
  }

  private whole(run: PieceRun): boolean {
    for (let index = run.first; index <= run.last; index++) if (!this.held(index)) return false;
    return true;
  }
}
