// Who may use the node's link: on-demand work (a layer being mounted, its prefetch, a read that has to
// fetch) always; background fetches only when no on-demand work has run for a quiet period, and only
// a few at once. One instance serves every layer a process mounts: a layer's background fetch must
// also yield to the mounts and reads of the others. Measured end to end (bench/e2e-cluster.ts, 2
// nodes × 50 Mbit/s, a 4-layer image): with each layer tracking only its own reads (and running its
// own 2 requests), the first layers' background fetch ran while containerd mounted the next ones and
// the last node started after 20.5 s, against 11.5 s without background fetch; shared, 11.7 s against
// 11.8 s. stargz-snapshotter keeps one such manager per node too (task.BackgroundTaskManager).
import { setTimeout as sleep } from 'node:timers/promises';

export interface FetchPrioritySettings {
  /** Background requests at once, for all layers together. */
  backgroundSlots: number;
  /** Milliseconds without on-demand work before a background request may start. */
  quietMs: number;
}

export class FetchPriority {
  private demandActive = 0;
  private lastDemandEnd = 0;
  private backgroundActive = 0;
  /** Woken when on-demand work ends or a background slot frees up. */
  private waiters: Array<() => void> = [];

  constructor(private settings: FetchPrioritySettings) {}

  configure(settings: FetchPrioritySettings): void {
    this.settings = settings;
    this.wake();
  }

  /** Runs on-demand work: background requests wait until it, and a quiet period after it, are over. */
  async demand<T>(work: () => Promise<T>): Promise<T> {
    const end = this.beginDemand();
    try {
      return await work();
    } finally {
      end();
    }
  }

  /** Marks on-demand work as started; call the function it returns (once) when it is over. */
  beginDemand(): () => void {
    this.demandActive++;
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      this.demandActive--;
      this.lastDemandEnd = Date.now();
      this.wake();
    };
  }

  /** Runs background work once the node is quiet and a slot is free; undefined if `signal` aborts first. */
  async background<T>(work: () => Promise<T>, signal?: AbortSignal): Promise<T | undefined> {
    for (;;) {
      if (signal?.aborted) return undefined;
      const quietFor = Date.now() - this.lastDemandEnd;
      if (this.demandActive > 0 || this.backgroundActive >= Math.max(1, this.settings.backgroundSlots)) {
        await this.nextChange(signal);
      } else if (quietFor < this.settings.quietMs) {
        await sleep(this.settings.quietMs - quietFor, undefined, { signal }).catch(() => {});
      } else {
        break;
      }
    }
    this.backgroundActive++;
    try {
      return await work();
    } finally {
      this.backgroundActive--;
      this.wake();
    }
  }

  /** On-demand work running now (for tests and logs). */
  get busy(): boolean {
    return this.demandActive > 0;
  }

  private nextChange(signal?: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        signal?.removeEventListener('abort', done);
        resolve();
      };
      this.waiters.push(done);
      signal?.addEventListener('abort', done, { once: true });
    });
  }

  private wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }
}
