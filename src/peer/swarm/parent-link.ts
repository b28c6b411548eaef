import { setTimeout as sleep } from 'node:timers/promises';
import { request, type Dispatcher } from 'undici';
import type { Logger } from '../../common/log.js';
import { httpScheme, type ClientTls } from '../../common/tls.js';
import { bitmapPath, pieceRequestPath, spanRequestPath, type PieceSpan, type PieceWish } from '../../rpc/upload-api.js';
import type { ParentInfo } from '../../rpc/scheduler-api.js';
import type { GrowingPiece } from '../growing-piece.js';
import { decodeBitmap } from '../upload/piece-board.js';
import { PieceFetcher, PieceTransferError, type PieceHead } from './piece-fetcher.js';
import type { ParentView } from './policy/parent-choice.js';
import { ParentPace } from './policy/parent-pace.js';

/** How long a bitmap request may wait at the parent for news. */
const LONG_POLL_MS = 10_000;
/** Bitmap requests failed in a row that make a parent unreachable (each retried 200 ms × n later). */
const BITMAP_FAILURES_UNREACHABLE = 3;
/** Piece requests failed in a row (not busy, not missing) that make a parent unreachable. */
const PIECE_FAILURES_UNREACHABLE = 2;

const NO_WISH: PieceWish = { wholeBlob: false, background: false };

export class ParentBusyError extends Error {
  override name = 'ParentBusyError';
}
export class PieceMissingError extends Error {
  override name = 'PieceMissingError';
}
/** A parent fetching on demand put a background piece off while children read what workloads wait for (503). */
export class PieceDeferredError extends Error {
  override name = 'PieceDeferredError';
}
/** The parent ended a piece early: it was relaying the piece and its own fetch of it gave up. */
export class PieceCutShortError extends Error {
  override name = 'PieceCutShortError';
}

/**
 * A child's connection to one parent: follows which pieces the parent holds (long-polling its
 * upload server) and fetches pieces from it. Piece bytes are checked by the caller.
 */
export class ParentLink implements ParentView {
  /** Pieces the parent holds, stored and verified. */
  readonly pieces = new Set<number>();
  /** Pieces on their way to the parent, which it relays as they arrive. */
  readonly growing = new Set<number>();
  /** The parent fetches any piece this child asks for (a seed the scheduler triggered), and relays it as it arrives. */
  onDemand = false;
  private attempts = 0;
  /** Spans being read from this parent (they finish on a retired link, as pieces do). */
  private spansOnTheWay = 0;
  /** Failures in a row, of bitmap requests or of pieces (a success resets it). */
  private consecutiveFailures = 0;
  /** How fast the parent serves this child. */
  readonly pace = new ParentPace();
  /** The parent said all its upload slots were busy: leave it alone until then (Date.now() clock). */
  busyUntil = 0;
  private known = -1;
  private readonly stop = new AbortController();
  private readonly fetcher: PieceFetcher;

  constructor(
    readonly info: ParentInfo,
    private readonly taskId: string,
    private readonly pieceCount: number,
    private readonly dispatcher: Dispatcher,
    /** Sent with every request: the cluster token, and what lets the parent authorize this child's client. */
    private readonly requestHeaders: Record<string, string>,
    private readonly tls: ClientTls | undefined,
    private readonly log: Logger,
    private readonly onUpdate: () => void,
    private readonly onUnreachable: (link: ParentLink, error: Error) => void,
  ) {
    const lines = Object.entries(requestHeaders)
      .map(([name, value]) => `${name}: ${value}\r\n`)
      .join('');
    this.fetcher = new PieceFetcher(info.ip, info.uploadPort, lines, tls);
  }

  get id(): string {
    return this.info.peerId;
  }

  get seed(): boolean {
    return this.info.seed;
  }

  /** Bytes per millisecond the parent served at lately. */
  get rate(): number {
    return this.pace.rate;
  }

  /** The scheduler's cap on pieces fetched from this parent at once, when it set one. */
  get piecesAtOnce(): number | undefined {
    const cap = this.info.piecesAtOnce;
    return cap !== undefined && cap > 0 ? cap : undefined;
  }

  get closed(): boolean {
    return this.stop.signal.aborted;
  }

  /** Pieces on their way from this parent to this peer. */
  get inflight(): number {
    return this.attempts;
  }

  /** The child began an attempt at a piece from this parent. */
  attemptStarted(): void {
    this.attempts++;
  }

  /** An attempt ended, however: a retired link closes with its last one. */
  attemptEnded(): void {
    this.attempts--;
    this.closeIfRetiredAndDone();
  }

  /** A retired link closes once its last piece and span are in. */
  private closeIfRetiredAndDone(): void {
    if (this.closed && this.attempts === 0 && this.spansOnTheWay === 0) this.fetcher.close();
  }

  /** A piece failed for a cause other than a clear answer (busy, missing): says whether that makes the parent unreachable (two in a row). */
  pieceFailed(): boolean {
    return ++this.consecutiveFailures >= PIECE_FAILURES_UNREACHABLE;
  }

  private get base(): string {
    const host = this.info.ip.includes(':') ? `[${this.info.ip}]` : this.info.ip;
    return `${httpScheme(this.tls)}://${host}:${this.info.uploadPort}`;
  }

  /** Follows the parent's piece bitmap until closed. */
  start(): void {
    void this.follow();
  }

  /** Stops at once: the bitmap poll and every piece on its way (a failed parent). */
  close(): void {
    this.stop.abort();
    this.fetcher.close();
  }

  /**
   * Stops following the parent (the scheduler chose others) but lets the pieces on their way
   * finish: cutting them would throw away bytes already received. The caller takes no new
   * pieces from a retired link and calls `attemptEnded` as each attempt ends.
   */
  retire(): void {
    this.stop.abort();
    this.closeIfRetiredAndDone();
  }

  private async follow(): Promise<void> {
    while (!this.closed) {
      try {
        const response = await request(`${this.base}${bitmapPath(this.taskId)}?known=${this.known}&wait=${LONG_POLL_MS}`, {
          headers: this.requestHeaders,
          signal: this.stop.signal,
          dispatcher: this.dispatcher,
          headersTimeout: LONG_POLL_MS + 5_000,
        });
        if (response.statusCode === 404) {
          await response.body.dump();
          continue; // the parent has nothing of the task yet; its long poll already waited
        }
        if (response.statusCode !== 200) throw new Error(`bitmap request answered ${response.statusCode}`);
        const body = (await response.body.json()) as {
          version: number;
          bitmap: string;
          growing?: string;
          onDemand?: boolean;
          complete: boolean;
        };
        this.consecutiveFailures = 0;
        this.known = body.version;
        const held = decodeBitmap(body.bitmap, this.pieceCount);
        const growing = body.growing ? decodeBitmap(body.growing, this.pieceCount) : new Set<number>();
        this.log.debug(
          { parent: this.id, version: body.version, complete: body.complete, onDemand: body.onDemand === true },
          'parent bitmap',
        );
        let changed = this.onDemand !== (body.onDemand === true);
        this.onDemand = body.onDemand === true;
        for (const index of held) {
          this.growing.delete(index);
          if (!this.pieces.has(index)) {
            this.pieces.add(index);
            changed = true;
          }
        }
        for (const index of this.growing) if (!growing.has(index)) this.growing.delete(index);
        for (const index of growing) {
          if (!this.growing.has(index) && !this.pieces.has(index)) {
            this.growing.add(index);
            changed = true;
          }
        }
        if (changed) this.onUpdate();
        // A parent holding the whole blob has no news to wait for.
        if (body.complete) return;
      } catch (error) {
        if (this.closed) return;
        this.log.debug({ parent: this.id, err: (error as Error).message }, 'parent bitmap request failed');
        this.consecutiveFailures++;
        if (this.consecutiveFailures >= BITMAP_FAILURES_UNREACHABLE) {
          this.onUnreachable(this, error as Error);
          return;
        }
        await sleep(200 * this.consecutiveFailures).catch(() => undefined);
      }
    }
  }

  /** The parent holds the piece, is receiving it, or fetches it when asked. */
  offers(index: number): boolean {
    return this.onDemand || this.carries(index);
  }

  /** The parent holds the piece or is receiving it (it fetches nothing for this child). */
  carries(index: number): boolean {
    return this.pieces.has(index) || this.growing.has(index);
  }

  /** The parent holds the piece stored and verified. */
  holdsWhole(index: number): boolean {
    return this.pieces.has(index);
  }

  /**
   * Fetches one piece's bytes into the buffer `begin` hands out once the parent has agreed to
   * send them (`advance` is called as bytes land, so this peer can relay them in turn; a busy or
   * missing answer costs no buffer and announces nothing). Throws ParentBusyError (429) or
   * PieceMissingError (404) when told so, PieceDeferredError (503) when a seed puts a background
   * piece off, PieceCutShortError when a piece ends early.
   */
  async fetchPiece(index: number, begin: () => GrowingPiece, signal: AbortSignal, wish?: PieceWish): Promise<Buffer> {
    const started = performance.now();
    let into: GrowingPiece | undefined;
    let head: PieceHead;
    try {
      head = await this.fetcher.get(
        // Only a parent fetching on demand heeds the wish (the rest of the blob too, or this piece later).
        pieceRequestPath(this.taskId, index, this.onDemand && wish ? wish : NO_WISH),
        (answer) => {
          if (answer.status !== 200) return undefined;
          const growing = begin();
          into = growing;
          return { buffer: growing.buffer, advance: (filled) => growing.advance(filled) };
        },
        signal,
      );
    } catch (error) {
      // The parent agreed and then broke off (a relayed piece whose fetch gave up upstream, or a
      // parent gone mid-piece): soft, another parent will do.
      if (!signal.aborted && into && error instanceof PieceTransferError) {
        throw new PieceCutShortError(`parent ${this.id} ended piece ${index} early: ${error.message}`);
      }
      throw error;
    }
    if (head.status === 429) {
      this.busyUntil = Date.now() + this.pace.answeredBusy();
      throw new ParentBusyError(`parent ${this.id} has no free upload slot`);
    }
    if (head.status === 503 && this.onDemand && wish?.background) {
      throw new PieceDeferredError(`parent ${this.id} puts background piece ${index} off while its children read on demand`);
    }
    if (head.status === 404) {
      this.pieces.delete(index);
      this.growing.delete(index);
      this.onDemand = false; // until its next bitmap says so again
      throw new PieceMissingError(`parent ${this.id} does not hold piece ${index}`);
    }
    if (head.status !== 200 || !into) throw new Error(`parent ${this.id} answered ${head.status} for piece ${index}`);
    const piece = into.buffer;
    const elapsed = performance.now() - started;
    this.pace.pieceServed(piece.length, elapsed);
    this.consecutiveFailures = 0;
    this.log.trace({ parent: this.id, index, ms: elapsed }, 'piece from parent');
    return piece;
  }

  /**
   * Fetches part of a piece (upload-api.ts SPAN_PATH) into `into`, whose buffer is the span's
   * length, calling its `advance` as bytes land. The bytes are not checked here: they go only
   * to readers that check them against a verified TOC. Throws ParentBusyError or
   * PieceMissingError as fetchPiece does, or an Error naming any other answer.
   */
  async fetchSpan(index: number, span: PieceSpan, hops: number, into: GrowingPiece, signal: AbortSignal): Promise<void> {
    this.spansOnTheWay++;
    try {
      await this.readSpan(index, span, hops, into, signal);
    } finally {
      this.spansOnTheWay--;
      this.closeIfRetiredAndDone();
    }
  }

  private async readSpan(index: number, span: PieceSpan, hops: number, into: GrowingPiece, signal: AbortSignal): Promise<void> {
    const head = await this.fetcher.get(
      spanRequestPath(this.taskId, index, span, hops),
      (answer) =>
        answer.status === 200 && answer.length === into.buffer.length
          ? { buffer: into.buffer, advance: (filled) => into.advance(filled) }
          : undefined,
      signal,
    );
    if (head.status === 429) {
      this.busyUntil = Date.now() + this.pace.answeredBusy();
      throw new ParentBusyError(`parent ${this.id} has no free upload slot`);
    }
    if (head.status === 404) throw new PieceMissingError(`parent ${this.id} has no bytes ${span.start}-${span.end} of piece ${index}`);
    if (head.status !== 200 || head.length !== into.buffer.length)
      throw new Error(
        `parent ${this.id} answered ${head.status} (${head.length} bytes) for bytes ${span.start}-${span.end} of piece ${index}`,
      );
  }
}
