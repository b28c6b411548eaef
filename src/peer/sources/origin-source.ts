import type { Logger } from '../../common/log.js';
import type { RateLimiter } from '../../common/rate-limiter.js';
import type { BufferBody } from '../../oci/buffer-body.js';
import type { RegistryTransport } from '../../oci/transport.js';
import { pieceBounds, type PieceLayout } from '../../storage/piece-plan.js';
import { GrowingPiece } from '../growing-piece.js';
import type { KeptSpan } from '../piece-spans.js';
import {
  BlobSizeMismatchError,
  UpstreamStatusError,
  type PieceBuffers,
  type PieceRun,
  type PieceSink,
  type PieceSource,
} from './piece-source.js';

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

/** A `Content-Range: bytes <start>-<end>/<total|*>` header's numbers, or undefined if it is not one. */
function parseContentRange(header: string): { start: number; end: number; total?: number } | undefined {
  const m = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(header);
  if (!m) return undefined;
  return { start: Number(m[1]), end: Number(m[2]), ...(m[3] === '*' ? {} : { total: Number(m[3]) }) };
}

/** What an origin read tells the peer's metrics. */
export interface OriginReadCounts {
  /** A blob GET went to the origin: a whole blob, a run of pieces or a span. */
  sent(): void;
  /** The origin answered a Range request with the whole blob. */
  rangeIgnored(): void;
}

const UNCOUNTED: OriginReadCounts = { sent: () => undefined, rangeIgnored: () => undefined };

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
    private readonly counts: OriginReadCounts = UNCOUNTED,
    /**
     * Bytes of a piece this peer already read from this origin (spans it read for lazy readers,
     * piece-spans.ts): a piece that has some is filled around them, so the registry sends each
     * byte once.
     */
    private readonly kept?: (index: number) => KeptSpan[],
  ) {}

  get description(): string {
    return `origin ${this.url.host}`;
  }

  /** The blob URL this source reads, and the client credentials it reads it with. */
  get client(): { url: URL; authorization?: string } {
    return { url: this.url, authorization: this.headers.authorization };
  }

  async fetchRun(layout: PieceLayout, run: PieceRun, sink: PieceSink, signal?: AbortSignal, buffers?: PieceBuffers): Promise<void> {
    if (!this.kept) return this.fetchWholePieces(layout, run, sink, signal, buffers);
    // Runs of pieces with nothing kept are read as runs; a piece with kept bytes, around them.
    let first = run.first;
    for (let index = run.first; index <= run.last + 1; index++) {
      const kept = index <= run.last ? this.kept(index) : [];
      if (index <= run.last && kept.length === 0) continue;
      if (index > first) await this.fetchWholePieces(layout, { first, last: index - 1 }, sink, signal, buffers);
      if (index <= run.last) await this.fillAround(layout, index, kept, sink, signal, buffers);
      first = index + 1;
    }
  }

  /** Reads piece `index` around the bytes kept of it (one Range request per gap) and hands it to the sink. */
  private async fillAround(
    layout: PieceLayout,
    index: number,
    kept: KeptSpan[],
    sink: PieceSink,
    signal?: AbortSignal,
    buffers?: PieceBuffers,
  ): Promise<void> {
    const bounds = pieceBounds(layout, index);
    const growing = buffers?.(index);
    const piece = growing?.buffer ?? Buffer.allocUnsafe(bounds.length);
    try {
      let position = 0;
      for (const span of [...kept].sort((a, b) => a.start - b.start)) {
        if (span.start > position) {
          await this.readInto(piece, bounds.offset, position, span.start - 1, index, signal);
          position = span.start;
        }
        const end = Math.min(span.start + span.bytes.length, bounds.length);
        if (end > position) span.bytes.copy(piece, position, position - span.start, end - span.start);
        position = Math.max(position, end);
        growing?.advance(position);
      }
      if (position < bounds.length) await this.readInto(piece, bounds.offset, position, bounds.length - 1, index, signal);
      growing?.advance(bounds.length);
      await sink(index, piece);
    } finally {
      growing?.end();
    }
  }

  /** Reads bytes [from, to] of the piece at `pieceOffset` into `piece` at the same place. */
  private readInto(piece: Buffer, pieceOffset: number, from: number, to: number, index: number, signal?: AbortSignal): Promise<void> {
    const into = new GrowingPiece(index, piece.subarray(from, to + 1), () => undefined);
    return this.readRange(pieceOffset + from, pieceOffset + to, into, signal);
  }

  private async fetchWholePieces(
    layout: PieceLayout,
    run: PieceRun,
    sink: PieceSink,
    signal?: AbortSignal,
    buffers?: PieceBuffers,
  ): Promise<void> {
    const start = pieceBounds(layout, run.first).offset;
    const lastPiece = pieceBounds(layout, run.last);
    const end = lastPiece.offset + lastPiece.length - 1;
    const wholeBlob = run.first === 0 && run.last === layout.pieceCount - 1;
    const headers = { ...this.headers };
    if (!wholeBlob) headers.range = `bytes=${start}-${end}`;

    this.counts.sent();
    const response = await this.transport.sendForBuffers(this.url, { headers, signal, expectedBytes: end + 1 - start });
    const { statusCode } = response;
    let bodyStart: number;
    if (statusCode === 200) {
      if (!wholeBlob) {
        this.log.warn({ origin: this.url.host }, 'origin ignored a Range request; reading the blob from its start instead');
        this.counts.rangeIgnored();
      }
      const length = Number(response.headers['content-length'] ?? layout.size);
      if (length !== layout.size) {
        response.body.destroy();
        throw new BlobSizeMismatchError(`origin sent ${length} bytes for a blob of ${layout.size} bytes`);
      }
      bodyStart = 0;
    } else if (statusCode === 206 && !wholeBlob) {
      const contentRange = String(response.headers['content-range'] ?? '');
      const answered = parseContentRange(contentRange);
      if (answered?.total !== undefined && answered.total !== layout.size) {
        response.body.destroy();
        throw new BlobSizeMismatchError(`origin answered a range of a blob of ${layout.size} bytes with Content-Range "${contentRange}"`);
      }
      if (answered?.start !== start || answered.end !== end) {
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

  /**
   * Reads blob bytes [start, end] into `into` (calling its `advance` as they land): one Range
   * request, which the origin must answer with exactly that range. For a span of a piece
   * (piece-spans.ts), so a whole blob is never read in its place.
   */
  async readRange(start: number, end: number, into: GrowingPiece, signal?: AbortSignal): Promise<void> {
    const length = end - start + 1;
    const headers = { ...this.headers, range: `bytes=${start}-${end}` };
    this.counts.sent();
    const response = await this.transport.sendForBuffers(this.url, { headers, signal, expectedBytes: length });
    const contentRange = String(response.headers['content-range'] ?? '');
    const answered = parseContentRange(contentRange);
    if (response.statusCode !== 206 || answered?.start !== start || answered.end !== end) {
      response.body.destroy();
      if (response.statusCode === 200) this.counts.rangeIgnored();
      throw new UpstreamStatusError(
        response.statusCode,
        relayableHeaders(response.headers),
        '',
        `origin answered bytes ${start}-${end} of ${this.url.pathname} with ${response.statusCode} "${contentRange}"`,
      );
    }
    let taken = 0;
    const filled = await response.body.fill(into.buffer, 0, length, (now) => {
      into.advance(now);
      return this.limiter.unlimited ? undefined : this.limiter.take(now - taken).then(() => void (taken = now));
    });
    if (filled < length) throw new Error(`origin closed the connection after ${filled} of bytes ${start}-${end}`);
    if ((await response.body.fill(Buffer.allocUnsafe(1), 0, 1)) !== 0) {
      response.body.destroy();
      throw new Error(`origin sent more than bytes ${start}-${end}`);
    }
  }

  /** Reads the body into whole pieces and hands each to the sink as it completes. */
  private async cutIntoPieces(
    layout: PieceLayout,
    body: BufferBody,
    bodyStart: number,
    bodyEnd: number,
    sink: PieceSink,
    buffers?: PieceBuffers,
  ): Promise<void> {
    // With `buffers`, each piece is read into a buffer that others may relay from as it fills.
    let growing: GrowingPiece | undefined;
    // Pieces being hashed and written while the next ones are read from the network.
    const pending: Promise<void>[] = [];
    const onFill = (filled: number) => {
      growing?.advance(filled);
      return this.limiter.unlimited ? undefined : this.limiter.take(filled - taken).then(() => void (taken = filled));
    };
    let taken = 0;
    try {
      // A zero-length blob still has one (empty) piece to deliver.
      const first = Math.floor(bodyStart / layout.pieceSize);
      const last = Math.max(first, Math.floor(bodyEnd / layout.pieceSize));
      for (let index = first; index <= last; index++) {
        const bounds = pieceBounds(layout, index);
        growing = buffers?.(index);
        const piece = growing?.buffer ?? Buffer.allocUnsafe(bounds.length);
        taken = 0;
        const filled = await body.fill(piece, 0, bounds.length, onFill);
        if (filled < bounds.length)
          throw new Error(`origin closed the connection after ${bounds.offset + filled - bodyStart} of ${bodyEnd + 1 - bodyStart} bytes`);
        const delivered = growing;
        growing = undefined;
        const stored = sink(index, piece).finally(() => delivered?.end());
        stored.catch(() => undefined); // awaited below, in order
        pending.push(stored);
        if (pending.length > PIPELINE_DEPTH) await pending.shift();
      }
      if ((await body.fill(Buffer.allocUnsafe(1), 0, 1)) !== 0) throw new Error('origin sent more bytes than it announced');
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
