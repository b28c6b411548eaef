// Background fetch: brings the rest of the layer into the cache while the workload is not
// reading, so later reads (and the node going offline) cost nothing. It yields to on-demand work
// through the fetcher's FetchPriority — every span waits until no mount, prefetch or on-demand
// fetch has run for a quiet period, and the node runs only a few spans at once, for all its layers.
import type { ChunkRef } from '../estargz/index.js';
import { spans, type ChunkFetcher } from './chunk-fetcher.js';

export interface BackgroundFetchOptions {
  enabled: boolean;
  /** Parallel requests (default 2), for every layer sharing this layer's FetchPriority. */
  concurrency?: number;
  /** Quiet time on the on-demand path before each background request (default 100 ms). */
  idleMs?: number;
  /** Compressed bytes per request (default 4 MiB). */
  spanBytes?: number;
}

export interface BackgroundProgress {
  /** Chunks the background pass still had to fetch when it started. */
  total: number;
  done: number;
  failed: number;
  finished: boolean;
}

export class BackgroundFetcher {
  readonly progress: BackgroundProgress = { total: 0, done: 0, failed: 0, finished: false };
  /** Resolves when every chunk has been tried (or stop() was called). */
  readonly finished: Promise<void>;
  private readonly abort = new AbortController();

  constructor(
    chunks: readonly ChunkRef[],
    private readonly fetcher: ChunkFetcher,
    private readonly options: BackgroundFetchOptions,
    private readonly onError: (error: unknown) => void = () => {},
  ) {
    const work = spans(
      chunks.filter((c) => !fetcher.store.has(c.digest)),
      options.spanBytes ?? 4 << 20,
    );
    this.progress.total = work.reduce((n, span) => n + span.length, 0);
    this.finished = this.run(work).finally(() => (this.progress.finished = true));
  }

  stop(): void {
    this.abort.abort();
  }

  private async run(work: ChunkRef[][]): Promise<void> {
    const signal = this.abort.signal;
    let next = 0;
    // The shared FetchPriority decides when each span may go, and caps the node's spans in flight.
    const worker = async () => {
      for (let span = work[next++]; span && !signal.aborted; span = work[next++]) {
        // Chunks an on-demand read fetched meanwhile are skipped by fill().
        try {
          const fetched = await this.fetcher.priority.background(() => this.fetcher.fill(span, 'background').then(() => true), signal);
          if (fetched) this.progress.done += span.length;
        } catch (error) {
          this.progress.failed += span.length;
          this.onError(error);
        }
      }
    };
    await Promise.all(Array.from({ length: Math.max(1, this.options.concurrency ?? 2) }, worker));
  }
}
