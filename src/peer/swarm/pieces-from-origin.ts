import type { Logger } from '../../common/log.js';
import type { BlobTask } from '../blob-task.js';
import type { GrowingPiece } from '../growing-piece.js';
import type { OriginSource } from '../sources/origin-source.js';
import { BlobSizeMismatchError } from '../sources/piece-source.js';
import { originRuns } from './policy/origin-runs.js';
import type { WantedPieces } from './wanted-pieces.js';

/** Origin reads that fail in a row before the download gives up. */
const ORIGIN_FAILURES_GIVE_UP = 4;

export interface OriginReadEvents {
  /** Opens a piece's relay buffer as its bytes start to arrive. */
  beginPiece(index: number): GrowingPiece;
  /** The origin failed too often: the download gives up with `error`. */
  gaveUp(error: Error): void;
}

/**
 * Reads a task's wanted pieces from the origin registry, when the scheduler sends the peer there
 * or the swarm fails it: every missing piece not on its way from a parent, in contiguous runs,
 * each run on a connection of its own (policy/origin-runs.ts), again until none is missing.
 */
export class PiecesFromOrigin {
  /** How this peer reads the origin: with the credentials of the first client that asked. */
  private source?: OriginSource;
  private readonly busy = new Set<number>();
  private failures = 0;
  private stopped = false;

  constructor(
    private readonly task: BlobTask,
    private readonly wanted: WantedPieces,
    /** A piece on its way from a parent, which the origin need not send. */
    private readonly fromParents: (index: number) => boolean,
    private readonly log: Logger,
    private readonly events: OriginReadEvents,
  ) {}

  /** The origin as the first client to ask would read it (its credentials); later clients' are not used. */
  use(source: OriginSource): void {
    this.source ??= source;
  }

  /** How this peer reads the origin, once a client has asked. */
  get origin(): OriginSource | undefined {
    return this.source;
  }

  get client(): OriginSource['client'] | undefined {
    return this.source?.client;
  }

  stop(): void {
    this.stopped = true;
  }

  /** Reads every wanted piece not yet stored, read, or on its way from a parent. */
  read(): void {
    const source = this.source;
    if (!source || this.stopped || this.wanted.failed) return;
    const missing = this.wanted.missing().filter((i) => !this.busy.has(i) && !this.fromParents(i));
    // Each run on a connection of its own, the blob's last piece (a lazy puller's TOC) first.
    for (const run of originRuns(missing, this.task.layout.pieceCount)) {
      for (let i = run.first; i <= run.last; i++) this.busy.add(i);
      void source
        .fetchRun(
          this.task.layout,
          run,
          (index, bytes) => this.task.storePiece(index, bytes, { from: 'origin' }),
          undefined,
          (index) => this.events.beginPiece(index),
        )
        .catch((error: Error) => {
          this.log.warn({ task: this.task.digest, err: error.message, attempt: this.failures }, 'origin fetch failed');
          // The blob's recorded size is wrong or the origin lies about it: drop the task (closing this download).
          if (error instanceof BlobSizeMismatchError) return void this.task.fail(error).catch(() => undefined);
          if (++this.failures >= ORIGIN_FAILURES_GIVE_UP) this.events.gaveUp(error);
        })
        .finally(() => {
          for (let i = run.first; i <= run.last; i++) this.busy.delete(i);
          if (this.wanted.missing().length > 0) this.read();
        });
    }
  }
}
