import type { Logger } from '../common/log.js';
import type { PieceCheckKind } from '../storage/piece-check.js';
import type { BlobStore } from '../storage/blob-store.js';
import type { BlobSource } from '../storage/stored-blob.js';
import { BlobTask, type TaskEvents } from './blob-task.js';

/** What a probe of the origin learned about a blob before any byte of it is fetched. */
export interface BlobProbe {
  size: number;
  /** The registry it is fetched for, and whether that registry serves it without credentials. */
  source: BlobSource;
}

/** A task handed to one request; `release` must be called when the request is done with it. */
export interface TaskLease {
  task: BlobTask;
  /** This request's probe created the task (so its client was just authorized by the origin). */
  created: boolean;
  release(): void;
}

/**
 * Keeps one BlobTask per digest, so that concurrent requests for a blob share one fetch, and
 * leases them so that eviction never removes a blob that somebody is reading or fetching.
 */
export class TaskManager {
  private readonly tasks = new Map<string, BlobTask>();
  private readonly opening = new Map<string, Promise<BlobTask>>();

  constructor(
    private readonly store: BlobStore,
    private readonly log: Logger,
    private readonly events: TaskEvents,
    /** How stored pieces are checked: 'sha256' in a swarm (its digests are reported), 'crc' otherwise. */
    private readonly pieceCheck: PieceCheckKind = 'sha256',
  ) {}

  /** A lease on a blob this peer already holds (complete or partial), or undefined. */
  lease(digest: string): TaskLease | undefined {
    const task = this.existing(digest);
    if (!task) return undefined;
    return { task, created: false, release: this.store.acquire(digest) };
  }

  /** A lease on the blob's task, creating it from `probe` (asked once however many callers wait). */
  async open(digest: string, probe: () => Promise<BlobProbe>): Promise<TaskLease> {
    const held = this.lease(digest);
    if (held) return held;
    let created = false;
    let pending = this.opening.get(digest);
    if (!pending) {
      created = true;
      pending = (async () => {
        const { size, source } = await probe();
        const blob = await this.store.create(digest, size, source);
        const task = new BlobTask(this.store, blob, this.log, this.wrapEvents(), this.pieceCheck);
        this.tasks.set(digest, task);
        return task;
      })();
      this.opening.set(digest, pending);
      pending.finally(() => this.opening.delete(digest)).catch(() => undefined);
    }
    const task = await pending;
    return { task, created, release: this.store.acquire(digest) };
  }

  list(): BlobTask[] {
    for (const blob of this.store.list()) this.existing(blob.digest);
    return [...this.tasks.values()];
  }

  /** Forgets a task whose blob left the store (evicted). */
  forget(digest: string): void {
    this.tasks.delete(digest);
  }

  private existing(digest: string): BlobTask | undefined {
    const task = this.tasks.get(digest);
    if (task && !task.failed) return task;
    const blob = this.store.get(digest);
    if (!blob) return undefined;
    if (!blob.complete && !blob.sources[0]?.registry) {
      // Partial, from before blobs recorded their registry: nothing says whose bytes they are.
      void this.store
        .remove(digest)
        .catch((error: Error) => this.log.warn({ digest, err: error.message }, 'could not drop a partial blob of unknown source'));
      return undefined;
    }
    const restored = new BlobTask(this.store, blob, this.log, this.wrapEvents(), this.pieceCheck);
    this.tasks.set(digest, restored);
    return restored;
  }

  private wrapEvents(): TaskEvents {
    return {
      pieceStored: (...args) => this.events.pieceStored(...args),
      pieceGrowing: (...args) => this.events.pieceGrowing?.(...args),
      verified: (...args) => this.events.verified(...args),
      failed: (task, error) => {
        if (this.tasks.get(task.digest) === task) this.tasks.delete(task.digest);
        this.events.failed(task, error);
      },
    };
  }
}
