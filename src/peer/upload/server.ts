import type { IncomingMessage, ServerResponse } from 'node:http';
import type { TLSSocket } from 'node:tls';
import type { Logger } from '../../common/log.js';
import type { RateLimiter } from '../../common/rate-limiter.js';
import { sendFileRange } from '../../common/sendfile.js';
import type { ClusterToken } from '../../common/token.js';
import { parseBlobUrl } from '../../oci/blob-url.js';
import {
  BITMAP_PATH,
  CLIENT_AUTHORIZATION_HEADER,
  CLIENT_ORIGIN_HEADER,
  PIECE_PATH,
  PREHEAT_PATH,
  PREHEAT_STATUS_PATH,
  MAX_SPAN_HOPS,
  SEED_TRIGGER_PATH,
  SPAN_PATH,
  pieceWish,
  blobFetchRequestSchema,
  type BlobFetchRequest,
  type FetchStatus,
  type PieceSpan,
  type PieceWish,
} from '../../rpc/upload-api.js';
import { parseWire, WireError } from '../../rpc/wire.js';
import { pieceBounds } from '../../storage/piece-plan.js';
import { writeChunk, ClientGoneError } from '../mirror/respond.js';
import type { AccessChecker } from '../access/checker.js';
import { ruleFor } from '../access/rule.js';
import type { BlobTask } from '../blob-task.js';
import { pieceBuffers } from '../piece-buffers.js';
import { arrivingBytes, type SpanView } from '../piece-spans.js';
import type { TaskManager } from '../task-manager.js';
import { encodeBitmap, type PieceBoard } from './piece-board.js';

const WRITE_CHUNK = 256 * 1024;
/** Bytes of a piece still arriving that are relayed at once (the last chunk may be smaller). */
const RELAY_CHUNK = 64 * 1024;
const MAX_LONG_POLL_MS = 30_000;

/**
 * Spans no longer than this share of the task's piece size (not of their own piece: a blob's
 * last piece, which holds the TOC and the footer, may be short) are served beside the upload
 * slots, in a lane of as many again. A lazy mount's footer and TOC reads are tens of bytes to a
 * few hundred KB and hold the mount up; while every slot streamed a 4 MiB piece (twelve nodes
 * mounting four layers at 10 Mbit/s) they were refused for seconds, and each child fell back to
 * the whole piece: a piece from the registry for a 51-byte footer. What they add to the upload
 * is small, and the rate limiter still paces it.
 */
const SMALL_SPAN_SHARE = 1 / 8;

/** Pieces and spans hold the upload slots; small spans have a lane of their own (SMALL_SPAN_SHARE). */
type UploadLane = 'slots' | 'smallSpans';

/** What the upload side reports of its load (for host announcements) and what it needs. */
export interface UploadServiceDeps {
  tasks: TaskManager;
  board: PieceBoard;
  limiter: RateLimiter;
  slots: number;
  /** Every request but /healthz must carry it. */
  clusterToken: ClusterToken;
  /** Asks a private blob's registry whether a child's client may read it. */
  access: AccessChecker;
  log: Logger;
  onUploaded(bytes: number): void;
  /** Counts a request by kind and how it was answered (a private piece or a trigger: refused too). */
  onRequest?(
    kind: 'piece' | 'span' | 'bitmap' | 'seed' | 'preheat' | 'preheat-status',
    outcome: 'sent' | 'relayed' | 'fetched' | 'put-off' | 'busy' | 'missing' | 'accepted' | 'refused',
  ): void;
  /** A seed's pieces fetched as children ask for them; undefined on peers that fetch nothing for others. */
  onDemand?: PiecesOnDemand;
  /**
   * Part of a piece this peer does not hold, for a child passing on a lazy reader's read
   * (Swarm.span); undefined when this peer reads no spans of the task.
   */
  spans?: (task: BlobTask, index: number, span: PieceSpan, hops: number) => SpanView | undefined;
  /** Handles `POST /_starling/seed` on a seed peer; undefined on ordinary peers. */
  seedTrigger?: (request: BlobFetchRequest) => Promise<void>;
  /** Handles the manager's `POST /_starling/preheat` and `GET /_starling/preheat/<digest>`. */
  preheat?: {
    start: (request: BlobFetchRequest) => Promise<void>;
    status: (digest: string) => FetchStatus | undefined;
  };
}

/**
 * A seed triggered by the scheduler fetches from the origin only the pieces its children ask for
 * (src/peer/swarm/swarm.ts): lazily read layers need a few pieces of hundreds, and a seed reading
 * whole blobs fills the registry's link while the nodes wait for those few.
 */
export interface PiecesOnDemand {
  /** This peer fetches any piece of the task a child asks for. */
  offers(digest: string): boolean;
  /** A child asked for a piece a workload waits for (any task): background pieces wait a while. */
  demanded(): void;
  /**
   * Starts fetching piece `index` for a child, once whoever asks, and the rest of the blob too
   * when the child wants all of it. A piece only background readers want is put off while
   * children ask for pieces workloads wait for; `not-offered` when this peer does not fetch the
   * task on demand.
   */
  fetch(task: BlobTask, index: number, wish: PieceWish): 'fetching' | 'put-off' | 'not-offered';
}

/** A relayed piece's fetch gave up before the piece was stored: the response is cut short. */
class PieceAbandonedError extends Error {
  override name = 'PieceAbandonedError';
}

export class UploadService {
  private readonly inUse: Record<UploadLane, number> = { slots: 0, smallSpans: 0 };

  constructor(private readonly deps: UploadServiceDeps) {}

  /** Upload slots taken (the small spans' lane aside): what the scheduler places children by. */
  get slotsInUse(): number {
    return this.inUse.slots;
  }

  /** Serves piece bytes and piece bitmaps to peers holding the cluster token. */
  handle = (req: IncomingMessage, res: ServerResponse): void => {
    void this.route(req, res).catch((error: Error) => {
      if (error instanceof ClientGoneError || error instanceof PieceAbandonedError) return void res.destroy();
      this.deps.log.warn({ path: req.url, err: error.message }, 'upload request failed');
      if (res.headersSent) res.destroy();
      else this.reply(res, 500, { error: error.message });
    });
  };

  private async route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const [path, queryText] = (req.url ?? '/').split('?', 2) as [string, string | undefined];
    if (path === '/healthz') return this.reply(res, 200, { ok: true });
    if (!this.deps.clusterToken.accepts(req.headers.authorization))
      return this.reply(res, 401, { error: 'missing or wrong cluster token' });
    const [, spanDigest, spanIndex, spanStart, spanEnd] = SPAN_PATH.exec(path) ?? [];
    if (spanDigest !== undefined && req.method === 'GET') {
      const span = { start: Number(spanStart), end: Number(spanEnd) };
      return this.serveSpan(req, res, spanDigest, Number(spanIndex), span, Number(new URLSearchParams(queryText ?? '').get('hops') ?? 0));
    }
    const [, pieceDigest, pieceIndex] = PIECE_PATH.exec(path) ?? [];
    if (pieceDigest !== undefined && req.method === 'GET')
      return this.servePiece(req, res, pieceDigest, Number(pieceIndex), pieceWish(new URLSearchParams(queryText ?? '')));
    const [, bitmapDigest] = BITMAP_PATH.exec(path) ?? [];
    if (bitmapDigest !== undefined && req.method === 'GET')
      return this.serveBitmap(req, res, bitmapDigest, new URLSearchParams(queryText ?? ''));
    if (path === SEED_TRIGGER_PATH && req.method === 'POST')
      return this.acceptTrigger(req, res, 'seed', this.deps.seedTrigger, 'this peer is not a seed');
    if (path === PREHEAT_PATH && req.method === 'POST')
      return this.acceptTrigger(req, res, 'preheat', this.deps.preheat?.start, 'preheat is not enabled');
    const [, preheatDigest] = PREHEAT_STATUS_PATH.exec(path) ?? [];
    if (preheatDigest !== undefined && req.method === 'GET' && this.deps.preheat) {
      const status = this.deps.preheat.status(preheatDigest);
      this.deps.onRequest?.('preheat-status', status ? 'sent' : 'missing');
      return this.reply(res, status ? 200 : 404, status ?? { error: `no preheat of ${preheatDigest} here` });
    }
    return this.reply(res, 404, { error: `no such endpoint ${req.method} ${path}` });
  }

  private async servePiece(req: IncomingMessage, res: ServerResponse, digest: string, index: number, wish: PieceWish): Promise<void> {
    const lease = this.deps.tasks.lease(digest);
    if (!lease) return this.reply(res, 404, { error: `task ${digest} is not here` });
    try {
      const { task } = lease;
      const here = (i: number) => task.hasPiece(i) || task.isGrowing(i);
      if (index >= task.layout.pieceCount || !(here(index) || this.deps.onDemand?.offers(digest))) {
        this.deps.onRequest?.('piece', 'missing');
        return this.reply(res, 404, { error: `piece ${index} is not here` });
      }
      const refusal = await this.refusePrivatePiece(req, task);
      if (refusal) {
        this.deps.onRequest?.('piece', 'refused');
        return this.reply(res, 403, { error: refusal });
      }
      if (this.refusedBusy(res, 'piece', 'slots')) return;
      this.inUse.slots++;
      try {
        if (!wish.background) this.deps.onDemand?.demanded();
        const fetched = !here(index);
        if (fetched) {
          // The slot is the child's while the origin answers: the piece's bytes follow at once.
          const fetch = this.deps.onDemand?.fetch(task, index, wish) ?? 'not-offered';
          if (fetch === 'put-off') {
            this.deps.onRequest?.('piece', 'put-off');
            res.setHeader('retry-after', '1');
            return this.reply(res, 503, { error: `background piece ${index} put off while children read what their workloads wait for` });
          }
          if (fetch === 'not-offered') {
            this.deps.onRequest?.('piece', 'missing');
            return this.reply(res, 404, { error: `piece ${index} is not here` });
          }
          const failure = await task.waitForFirstBytes(index).then(
            () => undefined,
            (error: Error) => error,
          );
          if (failure) {
            this.deps.onRequest?.('piece', 'missing');
            return this.reply(res, 502, { error: `piece ${index}: fetching it from the origin failed: ${failure.message}` });
          }
        }
        const { length } = pieceBounds(task.layout, index);
        res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': length });
        res.flushHeaders(); // the child knows at once it has the slot, even if the bytes are still to come
        const whole = task.hasPiece(index);
        this.deps.onRequest?.('piece', whole ? 'sent' : fetched ? 'fetched' : 'relayed');
        const relayed = whole ? 0 : await this.relayGrowing(res, task, index, length);
        await this.sendStored(res, task, index, relayed, length);
        res.end();
      } finally {
        this.inUse.slots--;
      }
    } finally {
      lease.release();
    }
  }

  /** Answers 429 when every slot of the lane is taken: the child asks another parent, or this one a moment later. */
  private refusedBusy(res: ServerResponse, kind: 'piece' | 'span', lane: UploadLane): boolean {
    if (this.inUse[lane] < this.deps.slots) return false;
    this.deps.onRequest?.(kind, 'busy');
    res.setHeader('retry-after', '1');
    this.reply(res, 429, { error: 'all upload slots are busy' });
    return true;
  }

  /**
   * Sends bytes [start, end] of piece `index`: from the stored piece, or from a span kept here or
   * read upstream for this child (Swarm.span), relayed as it arrives. A span read upstream that
   * breaks off cuts the response short.
   */
  private async serveSpan(
    req: IncomingMessage,
    res: ServerResponse,
    digest: string,
    index: number,
    span: PieceSpan,
    hops: number,
  ): Promise<void> {
    const lease = this.deps.tasks.lease(digest);
    if (!lease) return this.reply(res, 404, { error: `task ${digest} is not here` });
    try {
      const { task } = lease;
      if (index >= task.layout.pieceCount) return this.reply(res, 404, { error: `piece ${index} is not a piece of ${digest}` });
      const { length } = pieceBounds(task.layout, index);
      if (!Number.isSafeInteger(span.start) || !Number.isSafeInteger(span.end) || span.start > span.end || span.end >= length)
        return this.reply(res, 416, { error: `bytes ${span.start}-${span.end} are not a span of piece ${index} (${length} bytes)` });
      if (!Number.isSafeInteger(hops) || hops < 0 || hops > MAX_SPAN_HOPS)
        return this.reply(res, 400, { error: `hops ${hops} is not from 0 to ${MAX_SPAN_HOPS}` });
      const refusal = await this.refusePrivatePiece(req, task);
      if (refusal) {
        this.deps.onRequest?.('span', 'refused');
        return this.reply(res, 403, { error: refusal });
      }
      const stored = task.hasPiece(index);
      const arriving = stored ? undefined : this.deps.spans?.(task, index, span, hops + 1);
      if (!stored && !arriving) {
        this.deps.onRequest?.('span', 'missing');
        return this.reply(res, 404, { error: `bytes ${span.start}-${span.end} of piece ${index} are not here` });
      }
      const lane: UploadLane = span.end - span.start + 1 <= task.layout.pieceSize * SMALL_SPAN_SHARE ? 'smallSpans' : 'slots';
      if (this.refusedBusy(res, 'span', lane)) return;
      this.inUse[lane]++;
      try {
        this.deps.onDemand?.demanded();
        res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': span.end - span.start + 1 });
        res.flushHeaders();
        this.deps.onRequest?.('span', stored ? 'sent' : 'relayed');
        if (arriving) await this.relaySpan(res, arriving, span);
        else await this.sendStored(res, task, index, span.start, span.end + 1);
        res.end();
      } finally {
        this.inUse[lane]--;
      }
    } finally {
      lease.release();
    }
  }

  private async relaySpan(res: ServerResponse, arriving: SpanView, span: PieceSpan): Promise<void> {
    const last = arriving.offset + span.end - span.start;
    for await (const bytes of arrivingBytes(arriving.bytes, arriving.offset, last, RELAY_CHUNK)) {
      for (let at = 0; at < bytes.length; at += WRITE_CHUNK) {
        const part = bytes.subarray(at, at + WRITE_CHUNK);
        await this.deps.limiter.take(part.length);
        await writeChunk(res, part);
        this.deps.onUploaded(part.length);
      }
    }
  }

  /**
   * Why a child may not have pieces of this blob, or undefined when it may (access/rule.ts): a
   * public blob's pieces go to any holder of the cluster token; a private blob's only over TLS,
   * to a child whose client names one of the blob's source registries, when that registry
   * accepts the client's credentials the child forwards (asked once a minute per client).
   */
  private async refusePrivatePiece(req: IncomingMessage, task: BlobTask): Promise<string | undefined> {
    const named = req.headers[CLIENT_ORIGIN_HEADER];
    let url: URL | undefined;
    try {
      if (typeof named === 'string' && parseBlobUrl(named).digest === task.digest) url = new URL(named);
    } catch {
      url = undefined;
    }
    const rule = ruleFor({ complete: task.complete, sources: task.blob.sources }, url?.origin ?? '');
    if (rule.kind === 'public') return undefined;
    if (!(req.socket as TLSSocket).encrypted)
      return `piece of a private blob: served only over TLS, where the client's registry credentials can travel`;
    if (rule.kind === 'foreign' || !url) {
      return `piece of a private blob: served only to a child whose client names one of its registries (${CLIENT_ORIGIN_HEADER}: <registry>/v2/<repository>/blobs/${task.digest})`;
    }
    const authorization = req.headers[CLIENT_AUTHORIZATION_HEADER];
    const decision = await this.deps.access.check(url, typeof authorization === 'string' ? authorization : undefined);
    return decision.allowed
      ? undefined
      : `piece of a private blob: registry ${url.origin} answered ${decision.status} for this child's client`;
  }

  /**
   * Relays a piece that is still arriving, as its bytes come in (cut-through). The last byte
   * is held back until the piece is stored, so a piece that fails its check here is cut short
   * for the child rather than passed on whole. Returns how many bytes were sent; the caller
   * sends the rest from the store. A piece whose fetch gives up ends the response early.
   */
  private async relayGrowing(res: ServerResponse, task: BlobTask, index: number, length: number): Promise<number> {
    let sent = 0;
    while (!task.hasPiece(index)) {
      const piece = task.growingPiece(index);
      if (!piece) throw new PieceAbandonedError(`piece ${index} of ${task.digest} was abandoned while relayed`);
      const available = Math.min(piece.filled, length - 1);
      // Relayed in sizeable chunks: writing each few arriving packets on their own would cost a
      // system call and a small segment apiece, here and at every peer downstream.
      if (available - sent >= RELAY_CHUNK || (available > sent && piece.filled >= length)) {
        const end = Math.min(available, sent + WRITE_CHUNK);
        // Held across the wait and the write: the piece may end meanwhile (see piece-buffers.ts).
        pieceBuffers.hold(piece.buffer);
        const release = () => pieceBuffers.release(piece.buffer);
        await this.deps.limiter.take(end - sent).catch((error: Error) => {
          release();
          throw error;
        });
        await writeChunk(res, piece.buffer.subarray(sent, end), release);
        this.deps.onUploaded(end - sent);
        sent = end;
        continue;
      }
      // Everything but the held-back byte is sent: wait for the fetch to end (stored, or given up).
      await piece.next(piece.filled >= length ? length : Math.min(sent + RELAY_CHUNK, length) - 1);
      if (res.destroyed) throw new ClientGoneError();
    }
    return sent;
  }

  /** Sends bytes [from, to) of a stored piece: from the page cache when it can, else through a buffer. */
  private async sendStored(res: ServerResponse, task: BlobTask, index: number, from: number, to: number): Promise<void> {
    const { offset } = pieceBounds(task.layout, index);
    for (let position = from; position < to; position += WRITE_CHUNK) {
      const size = Math.min(WRITE_CHUNK, to - position);
      await this.deps.limiter.take(size);
      const sent = await sendFileRange(res, task.blob.dataFd, offset + position, size).catch(() => {
        throw new ClientGoneError();
      });
      if (!sent) {
        const buffer = Buffer.allocUnsafe(size);
        await task.blob.read(buffer, offset + position, size);
        await writeChunk(res, buffer);
      }
      this.deps.onUploaded(size);
    }
  }

  /** The pieces held, answered at once if the caller's count is stale, else when it changes. */
  private async serveBitmap(req: IncomingMessage, res: ServerResponse, digest: string, query: URLSearchParams): Promise<void> {
    const known = Number(query.get('known') ?? -1);
    const waitMs = Math.min(MAX_LONG_POLL_MS, Math.max(0, Number(query.get('wait') ?? 0)));
    let lease = this.deps.tasks.lease(digest);
    if (!lease && waitMs > 0) {
      // A child may follow a parent that has not stored its first piece yet.
      await this.waitForNews(req, digest, waitMs);
      lease = this.deps.tasks.lease(digest);
    }
    if (!lease) return this.reply(res, 404, { error: `task ${digest} is not here` });
    try {
      const { task } = lease;
      if (task.availabilityVersion === known && waitMs > 0 && !task.complete) {
        await this.waitForNews(req, digest, waitMs);
      }
      this.deps.onRequest?.('bitmap', 'sent');
      this.reply(res, 200, {
        version: task.availabilityVersion,
        pieceCount: task.layout.pieceCount,
        complete: task.complete,
        bitmap: encodeBitmap(task.layout.pieceCount, (index) => task.hasPiece(index)),
        // Pieces on their way here: a child may ask for them and get the bytes as they arrive.
        growing: encodeBitmap(task.layout.pieceCount, (index) => task.isGrowing(index)),
        // Every other piece is fetched here when a child asks for it.
        onDemand: !task.complete && (this.deps.onDemand?.offers(digest) ?? false),
      });
    } finally {
      lease.release();
    }
  }

  /**
   * Waits for news of a task, giving up when the child hangs up. The listener is removed after:
   * kept-alive connections carry one long poll after another, and each would leave one behind.
   */
  private async waitForNews(req: IncomingMessage, digest: string, waitMs: number): Promise<void> {
    const hungUp = new AbortController();
    const onClose = () => hungUp.abort();
    req.socket.once('close', onClose);
    try {
      await this.deps.board.wait(digest, waitMs, hungUp.signal);
    } finally {
      req.socket.off('close', onClose);
    }
  }

  private async acceptTrigger(
    req: IncomingMessage,
    res: ServerResponse,
    kind: 'seed' | 'preheat',
    handler: ((request: BlobFetchRequest) => Promise<void>) | undefined,
    refusal: string,
  ): Promise<void> {
    const refuse = (status: number, error: string) => {
      this.deps.onRequest?.(kind, 'refused');
      this.reply(res, status, { error });
    };
    if (!handler) return refuse(403, refusal);
    let request: BlobFetchRequest;
    try {
      request = parseWire(blobFetchRequestSchema, JSON.parse(await readBody(req, 64 * 1024)), `${kind} request`);
    } catch (error) {
      // Not JSON, too large, or not the contract (WireError names each field at fault).
      return refuse(400, error instanceof WireError ? error.message : `bad ${kind} request: ${(error as Error).message}`);
    }
    if (Object.keys(request.origin.headers).length > 0 && !(req.socket as TLSSocket).encrypted) {
      return refuse(403, 'a request carrying registry credentials (origin.headers) is accepted only over TLS');
    }
    try {
      await handler(request);
    } catch (error) {
      return refuse(400, (error as Error).message);
    }
    this.deps.onRequest?.(kind, 'accepted');
    this.reply(res, 202, { accepted: true });
  }

  private reply(res: ServerResponse, status: number, body: unknown): void {
    const text = JSON.stringify(body);
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  }
}

async function readBody(req: IncomingMessage, limit: number): Promise<string> {
  let size = 0;
  const chunks: Buffer[] = [];
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > limit) throw new Error(`body larger than ${limit} bytes`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString('utf8');
}
