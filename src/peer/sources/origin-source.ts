import type { Logger } from '../../common/log.js';
import type { RateLimiter } from '../../common/rate-limiter.js';
import type { RegistryTransport } from '../../oci/transport.js';
import { pieceBounds, type PieceLayout } from '../../storage/piece-plan.js';
import type { GrowingPiece } from '../growing-piece.js';
import { UpstreamStatusError, type PieceBuffers, type PieceRun, type PieceSink, type PieceSource } from './piece-source.js';

/** Pieces handed to the sink but not yet stored, while reading goes on. */
const PIPELINE_DEPTH = 2;

/** Headers of an origin response worth relaying to a client that is refused. */
export function relayableHeaders(headers: Record<string, string | string[] | undefined>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of ['www-authenticate', 'content-type', 'docker-distribution-api-version', 'retry-after']) {
    const value = headers[name];
    if (typeof value === 'string') out[name] = value;
  }
  return out;
}

/**
 * Fetches pieces of one blob straight from its origin (a registry blob URL), with the client's
 * credentials. Runs that are not the whole blob are fetched with one Range request each; an
 * origin that answers a Range request with anything but the exact range is not trusted for it.
 */
export class OriginSource implements PieceSource {
  readonly kind = 'origin' as const;

  constructor(
    private readonly url: URL,
    private readonly headers: Record<string, string>,
    private readonly transport: RegistryTransport,
    private readonly limiter: RateLimiter,
    private readonly log: Logger,
    private readonly onRangeIgnored: () => void = () => undefined,
  ) {}

  get description(): string {
    return `origin ${this.url.host}`;
  }

  /** The request as a seed peer would repeat it on this client's behalf. */
  get request(): { url: string; headers: Record<string, string> } {
    return { url: this.url.href, headers: { ...this.headers } };
  }

  async fetchRun(layout: PieceLayout, run: PieceRun, sink: PieceSink, signal?: AbortSignal, buffers?: PieceBuffers): Promise<void> {
    const start = pieceBounds(layout, run.first).offset;
    const lastPiece = pieceBounds(layout, run.last);
    const end = lastPiece.offset + lastPiece.length - 1;
    const wholeBlob = run.first === 0 && run.last === layout.pieceCount - 1;
    const headers = { ...this.headers };
    if (!wholeBlob) headers.range = `bytes=${start}-${end}`;

    const response = await this.transport.send(this.url, { headers, signal });
    const { statusCode } = response;
    let bodyStart: number;
    if (statusCode === 200) {
      if (!wholeBlob) {
        this.log.warn({ origin: this.url.host }, 'origin ignored a Range request; reading the blob from its start instead');
        this.onRangeIgnored();
      }
      const length = Number(response.headers['content-length'] ?? layout.size);
      if (length !== layout.size) {
        response.body.destroy();
        throw new Error(`origin sent ${length} bytes for a blob of ${layout.size} bytes`);
      }
      bodyStart = 0;
    } else if (statusCode === 206 && !wholeBlob) {
      const contentRange = String(response.headers['content-range'] ?? '');
      const expected = new RegExp(`^bytes ${start}-${end}/(?:${layout.size}|\\*)$`);
      if (!expected.test(contentRange)) {
        response.body.destroy();
        throw new Error(`origin answered bytes ${start}-${end} with Content-Range "${contentRange}"`);
      }
      bodyStart = start;
    } else {
      const text = await response.body.text().catch(() => '');
      throw new UpstreamStatusError(
        statusCode,
        relayableHeaders(response.headers),
        text.slice(0, 4096),
        `origin answered ${statusCode} for ${this.url.pathname}`,
      );
    }
    await this.cutIntoPieces(layout, response.body, bodyStart, wholeBlob || statusCode === 200 ? layout.size - 1 : end, sink, buffers);
  }

  /** Reassembles the byte stream into whole pieces and hands each to the sink as it completes. */
  private async cutIntoPieces(
    layout: PieceLayout,
    body: AsyncIterable<Buffer> & { destroy(error?: Error): void },
    bodyStart: number,
    bodyEnd: number,
    sink: PieceSink,
    buffers?: PieceBuffers,
  ): Promise<void> {
    let index = Math.floor(bodyStart / layout.pieceSize);
    let bounds = pieceBounds(layout, index);
    // With `buffers`, each piece is read into a buffer that others may relay from as it fills.
    let growing: GrowingPiece | undefined;
    const bufferFor = (at: number, length: number): Buffer => {
      growing = buffers?.(at);
      return growing?.buffer ?? Buffer.allocUnsafe(length);
    };
    let piece = bufferFor(index, bounds.length);
    let filled = 0;
    let position = bodyStart;
    // Pieces being hashed and written while the next ones are read from the network.
    const pending: Promise<void>[] = [];
    const deliver = async (at: number, bytes: Buffer) => {
      const delivered = growing;
      growing = undefined;
      const stored = sink(at, bytes).finally(() => delivered?.end());
      stored.catch(() => undefined); // awaited below, in order
      pending.push(stored);
      if (pending.length > PIPELINE_DEPTH) await pending.shift();
    };
    try {
      // A zero-length blob still has one (empty) piece to deliver.
      if (bounds.length === 0) {
        await sink(index, piece);
        return;
      }
      for await (const chunk of body) {
        await this.limiter.take(chunk.length);
        if (position + chunk.length > bodyEnd + 1) throw new Error('origin sent more bytes than it announced');
        let consumed = 0;
        while (consumed < chunk.length) {
          const take = Math.min(chunk.length - consumed, bounds.length - filled);
          chunk.copy(piece, filled, consumed, consumed + take);
          filled += take;
          consumed += take;
          growing?.advance(filled);
          if (filled === bounds.length) {
            await deliver(index, piece);
            index++;
            if (index >= layout.pieceCount) break;
            bounds = pieceBounds(layout, index);
            if (bounds.offset > bodyEnd) break;
            piece = bufferFor(index, bounds.length);
            filled = 0;
          }
        }
        position += chunk.length;
      }
      if (position !== bodyEnd + 1) throw new Error(`origin closed the connection after ${position - bodyStart} of ${bodyEnd + 1 - bodyStart} bytes`);
      await Promise.all(pending);
    } catch (error) {
      body.destroy();
      await Promise.allSettled(pending);
      throw error;
    } finally {
      growing?.end(); // a piece cut short
    }
  }
}
