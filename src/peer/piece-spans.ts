// Spans: parts of pieces a peer does not hold whole, read for lazy readers (rpc/upload-api.ts
// SPAN_PATH). A lazy start reads a layer's prefetch range, TOC and footer: a few MB whose ends fall
// inside 4 MiB pieces, so whole pieces moved 1.48 times the bytes read at the registry and on
// every node's link (docs/benchmarks.md). A span moves only the bytes read. Each peer keeps the
// spans it read for a while, so that its children, and its own mirror's next read of the same
// range, are served without asking upstream again.
import type { PieceSpan } from '../rpc/upload-api.js';
import { GrowingPiece } from './growing-piece.js';

/** Bytes of spans kept per peer; the least recently used complete ones go first. */
const DEFAULT_MAX_BYTES = 64 * 1024 * 1024;

/** A span kept or arriving, and where the asked-for bytes begin in its buffer. */
export interface SpanView {
  bytes: GrowingPiece;
  /** Offset in `bytes.buffer` of the first byte asked for. */
  offset: number;
}

/** A span's bytes and where they begin in their piece. */
export interface KeptSpan {
  start: number;
  bytes: Buffer;
}

interface Kept {
  span: PieceSpan;
  bytes: GrowingPiece;
}

/** One peer's spans, by blob and piece: found by containment, fetched once however many ask. */
export class PieceSpans {
  /** By `digest/index`, in the order of last use (a Map keeps insertion order). */
  private readonly kept = new Map<string, Kept[]>();
  private keptBytes = 0;

  constructor(private readonly maxBytes = DEFAULT_MAX_BYTES) {}

  get bytes(): number {
    return this.keptBytes;
  }

  /** A span kept or arriving that covers `span` of the piece, if there is one. */
  find(digest: string, index: number, span: PieceSpan): SpanView | undefined {
    const key = `${digest}/${index}`;
    const list = this.kept.get(key);
    const found = list?.find((k) => k.span.start <= span.start && k.span.end >= span.end && !failed(k.bytes));
    if (!list || !found) return undefined;
    // Used again: move the piece's spans to the end of the eviction order.
    this.kept.delete(key);
    this.kept.set(key, list);
    return { bytes: found.bytes, offset: span.start - found.span.start };
  }

  /**
   * The span, found or fetched: `fetch` fills the buffer it is given and calls its `advance` as
   * bytes land; a fetch that fails (or fills less than the span) leaves nothing kept.
   */
  open(digest: string, index: number, span: PieceSpan, fetch: (into: GrowingPiece) => Promise<void>): SpanView {
    const found = this.find(digest, index, span);
    if (found) return found;
    const key = `${digest}/${index}`;
    const length = span.end - span.start + 1;
    const bytes = new GrowingPiece(index, Buffer.allocUnsafe(length), () => undefined);
    const entry: Kept = { span, bytes };
    const list = this.kept.get(key) ?? [];
    list.push(entry);
    this.kept.set(key, list);
    this.keptBytes += length;
    void fetch(bytes)
      .catch(() => undefined)
      .finally(() => {
        bytes.end();
        if (failed(bytes)) this.remove(key, entry);
        this.evict();
      });
    return { bytes, offset: 0 };
  }

  /** The spans of a piece whose bytes are all here (for filling the piece around them). */
  complete(digest: string, index: number): KeptSpan[] {
    const list = this.kept.get(`${digest}/${index}`) ?? [];
    return list.filter((k) => k.bytes.ended && !failed(k.bytes)).map((k) => ({ start: k.span.start, bytes: k.bytes.buffer }));
  }

  /** Drops the spans of one piece (it is stored whole now), or of the whole blob. */
  forget(digest: string, index?: number): void {
    for (const key of [...this.kept.keys()]) {
      if (index === undefined ? key.startsWith(`${digest}/`) : key === `${digest}/${index}`) {
        for (const entry of this.kept.get(key) ?? []) this.keptBytes -= entry.span.end - entry.span.start + 1;
        this.kept.delete(key);
      }
    }
  }

  private remove(key: string, entry: Kept): void {
    const list = this.kept.get(key);
    const at = list?.indexOf(entry) ?? -1;
    if (!list || at < 0) return;
    list.splice(at, 1);
    if (list.length === 0) this.kept.delete(key);
    this.keptBytes -= entry.span.end - entry.span.start + 1;
  }

  /** Drops the least recently used complete spans while over the bound (arriving ones have readers). */
  private evict(): void {
    for (const [key, list] of this.kept) {
      if (this.keptBytes <= this.maxBytes) return;
      for (const entry of [...list]) if (entry.bytes.ended) this.remove(key, entry);
    }
  }
}

/** The span's fetch ended without filling it. */
function failed(bytes: GrowingPiece): boolean {
  return bytes.ended && bytes.filled < bytes.buffer.length;
}

/**
 * Yields bytes [from, to] (offsets in `bytes.buffer`, `to` included) as they arrive, in chunks of
 * at least `chunk` bytes but the last; throws if the fetch ends before they are all there.
 */
export async function* arrivingBytes(bytes: GrowingPiece, from: number, to: number, chunk: number): AsyncGenerator<Buffer> {
  let position = from;
  while (position <= to) {
    const want = Math.min(position + chunk, to + 1);
    await bytes.next(want - 1);
    const end = Math.min(bytes.filled, to + 1);
    if (end < want && bytes.ended)
      throw new Error(`span of piece ${bytes.index} ended after ${bytes.filled} of ${bytes.buffer.length} bytes`);
    if (end <= position) continue;
    yield bytes.buffer.subarray(position, end);
    position = end;
  }
}
