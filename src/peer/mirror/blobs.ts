import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { itemAt } from '../../common/indexing.js';
import type { Logger } from '../../common/log.js';
import type { RateLimiter } from '../../common/rate-limiter.js';
import { parseBlobUrl } from '../../oci/blob-url.js';
import { OciError } from '../../oci/errors.js';
import type { RegistryTransport } from '../../oci/transport.js';
import { checksAgainstToc, READ_CHECKED_HEADER, READ_PRIORITY_HEADER, readPriority, type ReadPriority } from '../../rpc/mirror-api.js';
import type { PieceSpan } from '../../rpc/upload-api.js';
import { pieceBounds } from '../../storage/piece-plan.js';
import type { BlobTask } from '../blob-task.js';
import { originReadCounts, type PeerMetrics } from '../metrics.js';
import { arrivingBytes, type SpanView } from '../piece-spans.js';
import { OriginSource, relayableHeaders, type OriginReadCounts } from '../sources/origin-source.js';
import { UpstreamStatusError, type PieceSource } from '../sources/piece-source.js';
import type { BlobProbe, TaskLease, TaskManager } from '../task-manager.js';
import { multipartLayout, parseRange, type ByteRange } from '../http-range.js';
import { readableAnonymously, type AccessChecker } from '../access/checker.js';
import { ruleFor } from '../access/rule.js';
import { BlobStreamer, coveringPieces, type StreamPlan } from './blob-stream.js';
import { relayRangeFromRegistry, serveFromNamedRegistry } from './named-registry.js';
import type { Spool } from '../../storage/spool.js';
import { API_VERSION_HEADER, BLOB_CONTENT_TYPE, blobHeaders, writeBlobHead, writeChunk } from './respond.js';

export interface BlobServiceDeps {
  tasks: TaskManager;
  /** Fetches through the swarm when the peer has schedulers; straight from the origin otherwise. */
  sourceFor?: (task: BlobTask, origin: OriginSource) => PieceSource;
  /** Part of a piece through the swarm, for a client that checks what it reads (Swarm.span). */
  spanFor?: (task: BlobTask, index: number, span: PieceSpan, origin: OriginSource) => SpanView | undefined;
  transport: RegistryTransport;
  access: AccessChecker;
  /** Where a blob from a registry that is no source of the stored copy waits for its digest check. */
  spool: Spool;
  downloadLimiter: RateLimiter;
  metrics: PeerMetrics;
  log: Logger;
}

/** Serves `HEAD|GET /v2/<name>/blobs/<digest>` from the piece store, fetching what is missing. */
export class BlobService {
  private readonly streamer: BlobStreamer;
  private readonly originCounts: OriginReadCounts;

  constructor(private readonly deps: BlobServiceDeps) {
    this.streamer = new BlobStreamer(deps);
    this.originCounts = originReadCounts(deps.metrics);
  }

  async handle(req: IncomingMessage, res: ServerResponse, digest: string, blobUrl: URL): Promise<void> {
    const authorization = typeof req.headers.authorization === 'string' ? req.headers.authorization : undefined;
    const lease = await this.leaseAuthorized(digest, blobUrl, authorization, res, req.method === 'HEAD');
    if (lease === 'refused') return;
    if (lease.foreign) {
      try {
        return await serveFromNamedRegistry(req, res, blobUrl, lease.task, { ...this.deps, originCounts: this.originCounts });
      } finally {
        lease.release();
      }
    }
    try {
      const origin = new OriginSource(
        blobUrl,
        authorization ? { authorization } : {},
        this.deps.transport,
        this.deps.downloadLimiter,
        this.deps.log,
        this.originCounts,
      );
      await this.respond(req, res, lease.task, origin, blobUrl);
    } catch (error) {
      if (!(error instanceof UpstreamStatusError) || res.headersSent) throw error;
      // The registry's own refusal reaches the client as it is; its failures become a 502 naming them.
      if (error.status < 500) relayRefusal(res, error.status, error.headers, error.body, req.method === 'HEAD');
      else throw new OciError('UNAVAILABLE', `${error.message}`, { status: 502 });
    } finally {
      lease.task.blob.touch();
      lease.release();
    }
  }

  /**
   * Finds or creates the blob's task, making sure this client may read it (access/rule.ts): the
   * client's registry must be a source of the blob, and accept the client's credentials unless
   * the blob is public. `foreign`: the registry the client names is no source of the blob here.
   */
  private async leaseAuthorized(
    digest: string,
    blobUrl: URL,
    authorization: string | undefined,
    res: ServerResponse,
    headOnly: boolean,
  ): Promise<(TaskLease & { foreign?: boolean }) | 'refused'> {
    const { metrics } = this.deps;
    let lease = this.deps.tasks.lease(digest);
    metrics.blobRequests.inc({ cache: lease ? (lease.task.complete ? 'hit' : 'partial') : 'miss' });
    if (!lease) {
      try {
        lease = await this.deps.tasks.open(digest, () => this.probe(blobUrl, authorization));
      } catch (error) {
        if (error instanceof UpstreamStatusError) {
          relayRefusal(res, error.status, error.headers, error.body, headOnly);
          return 'refused';
        }
        throw error;
      }
    }
    // This request's own probe created the task: its registry just accepted its credentials.
    if (lease.created) return lease;
    const rule = ruleFor({ complete: lease.task.complete, sources: lease.task.blob.sources }, blobUrl.origin);
    if (rule.kind === 'public') return lease;
    if (rule.kind === 'foreign') {
      metrics.accessChecks.inc({ result: 'foreign' });
      return { ...lease, foreign: true };
    }
    const decision = await this.deps.access.check(blobUrl, authorization);
    metrics.accessChecks.inc({ result: decision.allowed ? 'allowed' : 'denied' });
    if (decision.allowed) return lease;
    lease.release();
    relayRefusal(res, decision.status, decision.headers, decision.body, headOnly);
    return 'refused';
  }

  /** HEAD the origin with the client's credentials: learns the size, and whether the blob is public. */
  private async probe(blobUrl: URL, authorization: string | undefined): Promise<BlobProbe> {
    const headers: Record<string, string> = authorization ? { authorization } : {};
    const response = await this.deps.transport.send(blobUrl, { method: 'HEAD', headers });
    await response.body.dump();
    if (response.statusCode !== 200) {
      throw new UpstreamStatusError(response.statusCode, relayableHeaders(response.headers), '', `origin answered ${response.statusCode}`);
    }
    const size = Number(response.headers['content-length']);
    if (!Number.isSafeInteger(size) || size < 0) {
      throw new OciError('UNAVAILABLE', `origin gave no usable Content-Length for ${blobUrl.pathname}`);
    }
    const isPublic = !authorization || (await readableAnonymously(this.deps.transport, blobUrl));
    this.deps.access.record(blobUrl, authorization, { allowed: true, status: 200, headers: {}, body: '' });
    const { registry, repository } = parseBlobUrl(blobUrl);
    return { size, source: { registry, repository, public: isPublic } };
  }

  private async respond(req: IncomingMessage, res: ServerResponse, task: BlobTask, origin: OriginSource, blobUrl: URL): Promise<void> {
    const source = this.deps.sourceFor?.(task, origin) ?? origin;
    const size = task.size;
    const range = parseRange(typeof req.headers.range === 'string' ? req.headers.range : undefined, size);
    const common = blobHeaders(task.digest);
    const headOnly = req.method === 'HEAD';

    if (range.kind === 'invalid') throw new OciError('RANGE_INVALID', range.reason, { status: 400 });
    if (range.kind === 'unsatisfiable') {
      throw new OciError('RANGE_INVALID', range.reason ?? `range not satisfiable for a blob of ${size} bytes`, {
        headers: { 'content-range': `bytes */${size}` },
      });
    }
    const whole = range.kind === 'none';
    const parts = whole ? [{ start: 0, end: size - 1 }] : range.ranges;
    // A satisfiable range request has at least one range (parseRange's rule); a whole read is one.
    const first = itemAt(parts, 0);
    const boundary = `starling-${randomBytes(12).toString('hex')}`;
    const multipart = parts.length > 1 ? multipartLayout(parts, size, BLOB_CONTENT_TYPE, boundary) : undefined;
    const head = () => {
      if (multipart)
        res.writeHead(206, { ...common, 'content-type': `multipart/byteranges; boundary=${boundary}`, 'content-length': multipart.length });
      else writeBlobHead(res, task.digest, size, whole ? undefined : first);
    };
    if (headOnly) {
      head();
      return void res.end();
    }
    // The last bytes of a whole-blob read wait for the digest check: a bad blob never arrives complete.
    if (whole) task.streamingReaders++;
    try {
      const fetchedForThis = new Set<number>();
      // A whole-blob read is never background: containerd waits for it.
      const priority = whole ? 'demand' : readPriority(req.headers[READ_PRIORITY_HEADER]);
      const spanned =
        source === origin || multipart ? new Map<number, Promise<Buffer | undefined>>() : this.spansFor(req, task, first, priority, origin);
      const [firstPiece, lastPiece] = coveringPieces(task, first);
      if (spanned.size > 0) {
        // The range's edge pieces come as spans; whole pieces between them as usual.
        const from = firstPiece + (spanned.has(firstPiece) ? 1 : 0);
        const to = lastPiece - (spanned.has(lastPiece) ? 1 : 0);
        if (from <= to) for (const index of task.request(from, to, source, priority)) fetchedForThis.add(index);
      } else {
        for (const part of parts) {
          for (const index of task.request(...coveringPieces(task, part), source, priority)) fetchedForThis.add(index);
        }
      }
      // Every FUSE read that misses the cache comes here: the arrays are built only when logged.
      if ((fetchedForThis.size > 0 || spanned.size > 0) && this.deps.log.isLevelEnabled('debug'))
        this.deps.log.debug(
          { digest: task.digest, range: whole ? undefined : first, priority, spans: [...spanned.keys()], pieces: [...fetchedForThis] },
          'read fetches',
        );
      // A span that could not be read: the whole piece after all.
      const fetchWhole = (index: number) => {
        for (const fetched of task.request(index, index, source, priority)) fetchedForThis.add(fetched);
      };
      const firstSpan = await spanned.get(firstPiece);
      if (spanned.has(firstPiece) && !firstSpan) fetchWhole(firstPiece);
      // The status line waits for the source's first bytes: a registry that fails after its HEAD
      // said 200 (a 500, a 401, a length it did not announce) gets the client a status saying so.
      if (!firstSpan) await task.waitForFirstBytes(firstPiece);
      const authorization = typeof req.headers.authorization === 'string' ? req.headers.authorization : undefined;
      const plan: StreamPlan = {
        whole,
        fetchedForThis,
        fromRegistry: (start, end) =>
          relayRangeFromRegistry(res, blobUrl, authorization, start, end, this.deps.transport, this.originCounts),
        spans: spanned,
        fetchWhole,
      };
      head();
      if (!multipart) {
        await this.streamer.stream(res, task, first, plan);
        return void res.end();
      }
      for (const part of multipart.parts) {
        await writeChunk(res, part.head);
        await this.streamer.stream(res, task, part.range, plan);
      }
      await writeChunk(res, multipart.tail);
      res.end();
    } finally {
      if (whole) {
        task.streamingReaders--;
        task.releaseMemory();
      }
    }
  }

  /**
   * The parts of the range's edge pieces to read as spans (piece-spans.ts), each with its bytes to
   * come (undefined if the span could not be read): for a read a workload waits for, from a client
   * that checks what it reads against a verified TOC, of a piece the range needs only part of and
   * that is neither here, nor arriving, nor requested by another such read. A background read
   * fills the cache with whole pieces.
   */
  private spansFor(
    req: IncomingMessage,
    task: BlobTask,
    range: ByteRange,
    priority: ReadPriority,
    origin: OriginSource,
  ): Map<number, Promise<Buffer | undefined>> {
    const spans = new Map<number, Promise<Buffer | undefined>>();
    const spanFor = this.deps.spanFor;
    if (!spanFor || priority !== 'demand' || !checksAgainstToc(req.headers[READ_CHECKED_HEADER])) return spans;
    const [first, last] = coveringPieces(task, range);
    for (const index of new Set([first, last])) {
      const bounds = pieceBounds(task.layout, index);
      const span = {
        start: Math.max(range.start, bounds.offset) - bounds.offset,
        end: Math.min(range.end, bounds.offset + bounds.length - 1) - bounds.offset,
      };
      if ((span.start === 0 && span.end === bounds.length - 1) || task.holdsOrFetchesOnDemand(index)) continue;
      const view = spanFor(task, index, span, origin);
      if (view) spans.set(index, this.spanBytes(view, span.end - span.start + 1, task, index));
    }
    return spans;
  }

  /** A span's bytes once they are all there, or undefined if its read failed. */
  private async spanBytes(view: SpanView, length: number, task: BlobTask, index: number): Promise<Buffer | undefined> {
    try {
      const parts: Buffer[] = [];
      for await (const bytes of arrivingBytes(view.bytes, view.offset, view.offset + length - 1, length)) parts.push(bytes);
      return parts.length === 1 ? parts[0] : Buffer.concat(parts, length);
    } catch (error) {
      this.deps.log.debug({ digest: task.digest, index, err: (error as Error).message }, 'span not read; fetching the whole piece');
      return undefined;
    }
  }
}

function relayRefusal(res: ServerResponse, status: number, headers: Record<string, string>, body: string, headOnly: boolean): void {
  const payload =
    body ||
    JSON.stringify({
      errors: [
        {
          code: status === 401 ? 'UNAUTHORIZED' : status === 403 ? 'DENIED' : status === 404 ? 'BLOB_UNKNOWN' : 'UNAVAILABLE',
          message: `registry answered ${status}`,
        },
      ],
    });
  res.writeHead(status, {
    ...API_VERSION_HEADER,
    'content-type': 'application/json',
    ...headers,
    'content-length': Buffer.byteLength(payload),
  });
  res.end(headOnly ? undefined : payload);
}
