// A RangeSource over one blob URL: every read is a single HTTP Range request. Meant for the
// local Starling peer (`/v2/<name>/blobs/<digest>?ns=<registry>`), which fetches only the
// pieces covering a range, through the swarm; works against a plain registry too.
import { setTimeout as sleep } from 'node:timers/promises';
import { Pool } from 'undici';
import { checkRange, type RangeSource } from '../estargz/index.js';
import { READ_CHECKED_HEADER, READ_PRIORITY_HEADER, type ReadPriority } from '../rpc/mirror-api.js';

export interface HttpRangeSourceOptions {
  /** Extra headers on every request (e.g. authorization). */
  headers?: Record<string, string>;
  /** Parallel connections to the server (default 8). */
  connections?: number;
  /** Attempts per read for network errors and 5xx answers (default 3). */
  attempts?: number;
  /**
   * The caller checks every byte it reads against a TOC whose digest it verified (a lazy mount):
   * the Starling peer may then answer with the parts of pieces a range needs (READ_CHECKED_HEADER).
   */
  checkedAgainstToc?: boolean;
}

/** A RangeSource that can also hand out one range as a stream (one request, bounded memory). */
export interface StreamingRangeSource extends RangeSource {
  stream(offset: number, length: number): AsyncIterable<Buffer>;
}

export interface FetchCounters {
  /** Range requests answered. */
  requests: number;
  /** Body bytes received. */
  bytes: number;
}

export class HttpRangeError extends Error {
  override name = 'HttpRangeError';
  constructor(
    message: string,
    readonly status?: number,
  ) {
    super(message);
  }
}

/** The peer mirror's URL for a blob: containerd's own form, `?ns=` naming the upstream registry. */
export function mirrorBlobUrl(mirror: string, repository: string, digest: string, registry: string): string {
  const url = new URL(`/v2/${repository}/blobs/${digest}`, mirror);
  url.searchParams.set('ns', registry);
  return url.toString();
}

export class HttpRangeSource implements StreamingRangeSource {
  readonly counters: FetchCounters = { requests: 0, bytes: 0 };
  private readonly path: string;

  private constructor(
    readonly url: URL,
    readonly size: number,
    private readonly pool: Pool,
    private readonly headers: Record<string, string>,
    private readonly attempts: number,
  ) {
    this.path = url.pathname + url.search;
  }

  /** Learns the blob's size (HEAD) and returns the source. */
  static async open(url: string, options: HttpRangeSourceOptions = {}): Promise<HttpRangeSource> {
    const parsed = new URL(url);
    const pool = new Pool(parsed.origin, { connections: options.connections ?? 8 });
    const headers = { ...options.headers, ...(options.checkedAgainstToc ? { [READ_CHECKED_HEADER]: 'toc' } : {}) };
    try {
      const res = await pool.request({ path: parsed.pathname + parsed.search, method: 'HEAD', headers });
      await res.body.dump();
      const length = Number(res.headers['content-length']);
      if (res.statusCode !== 200 || !Number.isSafeInteger(length)) {
        throw new HttpRangeError(
          `HEAD ${url}: HTTP ${res.statusCode}${Number.isSafeInteger(length) ? '' : ', no Content-Length'}`,
          res.statusCode,
        );
      }
      return new HttpRangeSource(parsed, length, pool, headers, Math.max(1, options.attempts ?? 3));
    } catch (error) {
      await pool.close();
      throw error;
    }
  }

  async read(
    offset: number,
    length: number,
    priority: ReadPriority = 'demand',
    options: { checkedPieces?: boolean } = {},
  ): Promise<Buffer> {
    checkRange(this.size, offset, length);
    if (length === 0) return Buffer.alloc(0);
    const parts: Buffer[] = [];
    for await (const part of this.stream(offset, length, priority, options)) parts.push(part);
    return Buffer.concat(parts, length);
  }

  /** [offset, offset+length) as one Range request; retried from the start only before the first byte. */
  async *stream(
    offset: number,
    length: number,
    priority: ReadPriority = 'demand',
    options: { checkedPieces?: boolean } = {},
  ): AsyncGenerator<Buffer> {
    checkRange(this.size, offset, length);
    if (length === 0) return;
    const body = await this.open(offset, length, priority, options.checkedPieces === true);
    let received = 0;
    for await (const chunk of body as AsyncIterable<Buffer>) {
      received += chunk.length;
      this.counters.bytes += chunk.length;
      if (received > length) throw new HttpRangeError(`${this.url}: range [${offset}, +${length}) answered with more bytes`);
      yield chunk;
    }
    if (received !== length) throw new HttpRangeError(`${this.url}: range [${offset}, +${length}) ended after ${received} bytes`);
  }

  private async open(offset: number, length: number, priority: ReadPriority, checkedPieces: boolean) {
    const range = `bytes=${offset}-${offset + length - 1}`;
    // The Starling peer passes a background read's mark on to the seeds it reads through; a plain registry ignores it.
    const headers: Record<string, string> =
      priority === 'background' ? { ...this.headers, range, [READ_PRIORITY_HEADER]: priority } : { ...this.headers, range };
    if (checkedPieces) delete headers[READ_CHECKED_HEADER];
    for (let attempt = 1; ; attempt++) {
      let retryable = true;
      try {
        const res = await this.pool.request({ path: this.path, method: 'GET', headers });
        if (res.statusCode === 206) {
          const contentRange = String(res.headers['content-range'] ?? '');
          const m = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(contentRange);
          if (!m || Number(m[1]) !== offset || Number(m[2]) !== offset + length - 1) {
            await res.body.dump();
            retryable = false;
            throw new HttpRangeError(`${this.url}: asked ${range}, got Content-Range "${contentRange}"`, 206);
          }
          this.counters.requests++;
          return res.body;
        }
        await res.body.dump();
        // 200 means the server ignored Range: never take a whole blob for a range.
        retryable = res.statusCode >= 500;
        throw new HttpRangeError(`${this.url}: ${range}: HTTP ${res.statusCode}`, res.statusCode);
      } catch (error) {
        if (!retryable || attempt >= this.attempts) throw error;
        await sleep(100 * attempt);
      }
    }
  }

  async close(): Promise<void> {
    await this.pool.close();
  }
}
