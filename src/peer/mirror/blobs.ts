import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from '../../common/log.js';
import { sendFileRange } from '../../common/sendfile.js';
import type { RateLimiter } from '../../common/rate-limiter.js';
import { OciError } from '../../oci/errors.js';
import type { RegistryTransport } from '../../oci/transport.js';
import { pieceBounds, piecesCovering } from '../../storage/piece-plan.js';
import type { BlobTask } from '../blob-task.js';
import { pieceBuffers } from '../piece-buffers.js';
import type { PeerMetrics } from '../metrics.js';
import { OriginSource, relayableHeaders } from '../sources/origin-source.js';
import { UpstreamStatusError, type PieceSource } from '../sources/piece-source.js';
import type { BlobProbe, TaskLease, TaskManager } from '../task-manager.js';
import { contentRange, multipartLayout, parseRange, type ByteRange } from '../http-range.js';
import type { AccessChecker } from './access.js';
import { API_VERSION_HEADER, ClientGoneError, writeChunk } from './respond.js';

/** Bytes read from disk per write to a client: large enough for throughput, small enough for memory. */
const READ_CHUNK = 1024 * 1024;
/** Bytes of a piece still arriving that are gathered before they are relayed to a client. */
const RELAY_CHUNK = 256 * 1024;
const BLOB_CONTENT_TYPE = 'application/octet-stream';

export interface BlobServiceDeps {
  tasks: TaskManager;
  /** Fetches through the swarm when the peer has schedulers; straight from the origin otherwise. */
  sourceFor?: (task: BlobTask, origin: OriginSource) => PieceSource;
  transport: RegistryTransport;
  access: AccessChecker;
  downloadLimiter: RateLimiter;
  metrics: PeerMetrics;
  log: Logger;
}

/** Serves `HEAD|GET /v2/<name>/blobs/<digest>` from the piece store, fetching what is missing. */
export class BlobService {
  constructor(private readonly deps: BlobServiceDeps) {}

  async handle(req: IncomingMessage, res: ServerResponse, digest: string, blobUrl: URL): Promise<void> {
    const authorization = typeof req.headers.authorization === 'string' ? req.headers.authorization : undefined;
    const lease = await this.leaseAuthorized(digest, blobUrl, authorization, res, req.method === 'HEAD');
    if (!lease) return;
    try {
      const origin = new OriginSource(
        blobUrl,
        authorization ? { authorization } : {},
        this.deps.transport,
        this.deps.downloadLimiter,
        this.deps.log,
        () => this.deps.metrics.originRangeIgnored.inc(),
      );
      await this.respond(req, res, lease.task, this.deps.sourceFor?.(lease.task, origin) ?? origin);
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
   * Finds or creates the blob's task, making sure this client may read it: a blob first fetched
   * with credentials is served to another client only after the registry accepts that client's.
   */
  private async leaseAuthorized(
    digest: string,
    blobUrl: URL,
    authorization: string | undefined,
    res: ServerResponse,
    headOnly: boolean,
  ): Promise<TaskLease | undefined> {
    const { metrics } = this.deps;
    let lease = this.deps.tasks.lease(digest);
    metrics.blobRequests.inc({ cache: lease ? (lease.task.complete ? 'hit' : 'partial') : 'miss' });
    if (!lease) {
      try {
        lease = await this.deps.tasks.open(digest, () => this.probe(blobUrl, authorization));
      } catch (error) {
        if (error instanceof UpstreamStatusError) {
          relayRefusal(res, error.status, error.headers, error.body, headOnly);
          return undefined;
        }
        throw error;
      }
    }
    if (lease.created || lease.task.blob.isPublic) return lease;
    const decision = await this.deps.access.check(blobUrl, authorization);
    metrics.accessChecks.inc({ result: decision.allowed ? 'allowed' : 'denied' });
    if (decision.allowed) return lease;
    lease.release();
    relayRefusal(res, decision.status, decision.headers, decision.body, headOnly);
    return undefined;
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
    let isPublic = !authorization;
    if (authorization) {
      const anonymous = await this.deps.transport.send(blobUrl, { method: 'HEAD' });
      await anonymous.body.dump();
      isPublic = anonymous.statusCode === 200;
    }
    this.deps.access.record(blobUrl, authorization, { allowed: true, status: 200, headers: {}, body: '' });
    return { size, public: isPublic };
  }

  private async respond(req: IncomingMessage, res: ServerResponse, task: BlobTask, source: PieceSource): Promise<void> {
    const size = task.size;
    const range = parseRange(typeof req.headers.range === 'string' ? req.headers.range : undefined, size);
    const common = { ...API_VERSION_HEADER, 'docker-content-digest': task.digest, 'accept-ranges': 'bytes', etag: `"${task.digest}"` };
    const headOnly = req.method === 'HEAD';

    if (range.kind === 'invalid') throw new OciError('RANGE_INVALID', range.reason, { status: 400 });
    if (range.kind === 'unsatisfiable') {
      throw new OciError('RANGE_INVALID', `range not satisfiable for a blob of ${size} bytes`, {
        headers: { 'content-range': `bytes */${size}` },
      });
    }
    if (range.kind === 'none') {
      if (headOnly) return void res.writeHead(200, { ...common, 'content-type': BLOB_CONTENT_TYPE, 'content-length': size }).end();
      // The last bytes of a whole-blob read wait for the digest check: a bad blob never arrives complete.
      task.streamingReaders++;
      try {
        await this.whenSourceAnswers(task, { start: 0, end: size - 1 }, source);
        res.writeHead(200, { ...common, 'content-type': BLOB_CONTENT_TYPE, 'content-length': size });
        await this.streamRange(res, task, { start: 0, end: size - 1 }, source, true);
      } finally {
        task.streamingReaders--;
        task.releaseMemory();
      }
      return void res.end();
    }
    if (!headOnly) await this.whenSourceAnswers(task, range.ranges[0]!, source);
    if (range.ranges.length === 1) {
      const only = range.ranges[0]!;
      res.writeHead(206, {
        ...common,
        'content-type': BLOB_CONTENT_TYPE,
        'content-range': contentRange(only, size),
        'content-length': only.end - only.start + 1,
      });
      if (headOnly) return void res.end();
      await this.streamRange(res, task, only, source, false);
      return void res.end();
    }
    const boundary = `starling-${randomBytes(12).toString('hex')}`;
    const layout = multipartLayout(range.ranges, size, BLOB_CONTENT_TYPE, boundary);
    res.writeHead(206, {
      ...common,
      'content-type': `multipart/byteranges; boundary=${boundary}`,
      'content-length': layout.length,
    });
    if (headOnly) return void res.end();
    for (const part of layout.parts) task.request(...coveringPieces(task, part.range), source);
    for (const part of layout.parts) {
      await writeChunk(res, part.head);
      await this.streamRange(res, task, part.range, source, false);
    }
    await writeChunk(res, layout.tail);
    res.end();
  }

  /**
   * Starts fetching the pieces of `range` and waits until the first one is stored or arriving.
   * The status line waits for it: a registry that fails after its HEAD said 200 (a 500, a 401, a
   * length it did not announce) then gets its client a status that says so, not a 200 cut short.
   */
  private async whenSourceAnswers(task: BlobTask, range: ByteRange, source: PieceSource): Promise<void> {
    const [first, last] = coveringPieces(task, range);
    task.request(first, last, source);
    await task.waitForFirstBytes(first);
  }

  /** Sends bytes [start, end] as their pieces become available, fetching the missing ones. */
  private async streamRange(
    res: ServerResponse,
    task: BlobTask,
    range: ByteRange,
    source: PieceSource,
    holdLastPieceForVerification: boolean,
  ): Promise<void> {
    if (range.end < range.start) {
      // A zero-byte blob: nothing to send, but it must still have been verified.
      task.request(0, 0, source);
      await task.waitForPiece(0);
      if (holdLastPieceForVerification) await task.whenVerified();
      return;
    }
    const [first, last] = coveringPieces(task, range);
    task.request(first, last, source);
    for (let index = first; index <= last; index++) {
      const bounds = pieceBounds(task.layout, index);
      let position = Math.max(range.start, bounds.offset);
      const stop = Math.min(range.end, bounds.offset + bounds.length - 1);
      const holdForVerification = holdLastPieceForVerification && index === task.layout.pieceCount - 1;
      if (!holdForVerification) position = await this.relayFromOrigin(res, task, index, position, stop);
      if (position > stop) continue;
      await task.waitForPiece(index);
      if (holdForVerification) await task.whenVerified();
      const inMemory = task.recentPiece(index);
      if (!inMemory && task.complete && (await this.sendFromDisk(res, task, position, range.end))) return;
      if (inMemory) {
        // Just arrived: send it from memory rather than reading it back from disk.
        pieceBuffers.hold(inMemory);
        await writeChunk(res, inMemory.subarray(position - bounds.offset, stop - bounds.offset + 1), () => pieceBuffers.release(inMemory));
        this.deps.metrics.servedBytes.inc(stop - position + 1);
        continue;
      }
      // The next chunk is read from disk while the current one goes out on the socket.
      const readAt = async (at: number): Promise<Buffer> => {
        const length = Math.min(READ_CHUNK, stop - at + 1);
        const buffer = Buffer.allocUnsafe(length);
        const read = await task.blob.read(buffer, at, length);
        if (read !== length) throw new Error(`short read of ${task.digest} at ${at}`);
        return buffer;
      };
      let next: Promise<Buffer> | undefined = readAt(position);
      try {
        while (next) {
          const buffer: Buffer = await next;
          position += buffer.length;
          next = position <= stop ? readAt(position) : undefined;
          await writeChunk(res, buffer);
          this.deps.metrics.servedBytes.inc(buffer.length);
        }
      } finally {
        next?.catch(() => {}); // the client left: the read under way has no one to go to
      }
    }
  }

  /**
   * Sends bytes [position, stop] of piece `index` as they arrive from the origin, before the
   * piece is stored (bytes from parents wait for their piece check). Returns the position reached:
   * the rest is sent from the store once the piece is there.
   */
  private async relayFromOrigin(res: ServerResponse, task: BlobTask, index: number, position: number, stop: number): Promise<number> {
    const { offset } = pieceBounds(task.layout, index);
    while (position <= stop) {
      // Sizeable writes: a write per arriving packet would cost a system call each.
      const want = Math.min(position + RELAY_CHUNK, stop + 1) - offset;
      const growing = await task.waitForOriginBytes(index, want - 1);
      if (!growing) break; // stored: the rest goes from the store
      const end = Math.min(growing.filled + offset, stop + 1);
      // The buffer came held for us; the write lets go of it.
      await writeChunk(res, growing.buffer.subarray(position - offset, end - offset), () => pieceBuffers.release(growing.buffer));
      this.deps.metrics.servedBytes.inc(end - position);
      position = end;
    }
    return position;
  }

  /** Sends [start, end] of a verified blob straight from disk with sendfile(2), when it can. */
  private async sendFromDisk(res: ServerResponse, task: BlobTask, start: number, end: number): Promise<boolean> {
    const count = end - start + 1;
    const sent = await sendFileRange(res, task.blob.dataFd, start, count).catch((error: Error) => {
      this.deps.log.debug({ digest: task.digest, err: error.message }, 'sendfile stopped');
      throw new ClientGoneError();
    });
    if (sent) {
      this.deps.metrics.servedBytes.inc(count);
      this.deps.metrics.sendfileBytes.inc(count);
    }
    return sent;
  }
}

function coveringPieces(task: BlobTask, range: ByteRange): [number, number] {
  const { first, last } = piecesCovering(task.layout, range.start, Math.max(range.start, range.end));
  return [first, last];
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
