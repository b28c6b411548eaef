import type { IncomingMessage, ServerResponse } from 'node:http';
import { createStreamingHash } from '../../common/hashing.js';
import { itemAt } from '../../common/indexing.js';
import type { Logger } from '../../common/log.js';
import { sendFileRange } from '../../common/sendfile.js';
import { parseBlobUrl } from '../../oci/blob-url.js';
import { parseDigest } from '../../oci/digest.js';
import { OciError } from '../../oci/errors.js';
import type { RegistryTransport, TransportResponse } from '../../oci/transport.js';
import { BlobTooLargeError } from '../../storage/blob-store.js';
import type { Spool, SpoolFile } from '../../storage/spool.js';
import type { BlobSource } from '../../storage/stored-blob.js';
import { readableAnonymously } from '../access/checker.js';
import type { BlobTask } from '../blob-task.js';
import { parseRange, type ByteRange } from '../http-range.js';
import { relayableHeaders, type OriginReadCounts } from '../sources/origin-source.js';
import type { TaskManager } from '../task-manager.js';
import { coveringPieces } from './blob-stream.js';
import { passThrough } from './manifests.js';
import { API_VERSION_HEADER, ClientGoneError, writeBlobHead, writeChunk } from './respond.js';

export interface NamedRegistryDeps {
  transport: RegistryTransport;
  originCounts: OriginReadCounts;
  tasks: TaskManager;
  /** Where a blob waits for its digest check before any of it is served. */
  spool: Spool;
  log: Logger;
}

/** Bytes read back from a spooled blob per write to the client. */
const READ_CHUNK = 1024 * 1024;

/**
 * Serves a blob request naming a registry that is no source of the copy stored here
 * (access/rule.ts): a miss for that registry. Its bytes come from that registry, with the client's
 * credentials, and not one byte goes to the client before it is verified:
 *
 * - where this peer holds the bytes asked for verified (the blob, or the pieces covering the
 *   range), the registry's answer is compared with them as it arrives and each part is sent once
 *   it matched, so a range of a lazily read blob costs the registry no more than that range;
 * - otherwise the registry's whole blob is spooled to disk and checked against the digest, then
 *   the part asked for is sent from the spool (a multi-range request gets the whole blob).
 *
 * A HEAD carries no bytes: it is relayed as the registry answers it. A registry that sends the
 * blob verified becomes a further source of the copy stored here.
 */
export async function serveFromNamedRegistry(
  req: IncomingMessage,
  res: ServerResponse,
  blobUrl: URL,
  task: BlobTask,
  deps: NamedRegistryDeps,
): Promise<void> {
  if (req.method === 'HEAD') return passThrough(req, res, blobUrl, deps.transport);
  const authorization = typeof req.headers.authorization === 'string' ? req.headers.authorization : undefined;
  const rangeHeader = typeof req.headers.range === 'string' ? req.headers.range : undefined;
  const asked = parseRange(rangeHeader, task.size);
  if (asked.kind === 'invalid') throw new OciError('RANGE_INVALID', asked.reason, { status: 400 });
  if (asked.kind === 'unsatisfiable' && task.complete) {
    // The stored copy is verified, so its size is the blob's: no registry can satisfy the range.
    throw new OciError('RANGE_INVALID', asked.reason ?? `range not satisfiable for a blob of ${task.size} bytes`, {
      headers: { 'content-range': `bytes */${task.size}` },
    });
  }
  const named = { url: blobUrl, authorization, transport: deps.transport, counts: deps.originCounts };
  let deliveredWhole: boolean;
  if (asked.kind === 'none' && task.complete) {
    deliveredWhole = await compareWithStored(res, named, task, { start: 0, end: task.size - 1 }, false);
  } else if (asked.kind === 'ranges' && asked.ranges.length === 1 && coveredVerified(task, itemAt(asked.ranges, 0))) {
    await compareWithStored(res, named, task, itemAt(asked.ranges, 0), true);
    deliveredWhole = false; // a range proves nothing of the whole blob
  } else {
    deliveredWhole = await spoolAndServe(res, named, rangeHeader, task.digest, deps);
  }
  // Only a registry that just delivered the whole blob, verified, becomes a source of it.
  if (!deliveredWhole) return;
  const location = parseBlobUrl(blobUrl);
  await recordSource(deps, task.digest, {
    registry: location.registry,
    repository: location.repository,
    public: !authorization || (await readableAnonymously(deps.transport, blobUrl)),
  });
}

interface NamedBlob {
  url: URL;
  authorization: string | undefined;
  transport: RegistryTransport;
  counts: OriginReadCounts;
}

function coveredVerified(task: BlobTask, range: ByteRange): boolean {
  const [first, last] = coveringPieces(task, range);
  for (let index = first; index <= last; index++) if (!task.pieceVerified(index)) return false;
  return true;
}

/**
 * Asks the named registry for the blob, or bytes [range.start, range.end] of it. Resolves with
 * its body and the blob offset of the body's first byte, or undefined once the registry's
 * refusal (401, 404...) has been relayed to the client as it is.
 */
async function askRegistry(
  res: ServerResponse,
  named: NamedBlob,
  range?: ByteRange,
): Promise<{ body: TransportResponse['body']; offset: number; length: number } | undefined> {
  const headers: Record<string, string> = {};
  if (named.authorization) headers.authorization = named.authorization;
  if (range) headers.range = `bytes=${range.start}-${range.end}`;
  named.counts.sent();
  const response = await named.transport.send(named.url, { headers });
  const { registry, digest } = parseBlobUrl(named.url);
  const length = Number(response.headers['content-length']);
  if (response.statusCode === 200 || response.statusCode === 206) {
    const answered = String(response.headers['content-range'] ?? '');
    const offset = response.statusCode === 206 && range && answered.startsWith(`bytes ${range.start}-${range.end}/`) ? range.start : 0;
    if (Number.isSafeInteger(length) && length >= 0 && (response.statusCode === 200 || offset === range?.start)) {
      return { body: response.body, offset, length };
    }
    response.body.destroy();
    throw new OciError(
      'UNAVAILABLE',
      `registry ${registry} answered ${digest} with ${response.statusCode} "${answered}" and no usable length`,
      {
        status: 502,
      },
    );
  }
  const text = (await response.body.text().catch(() => '')).slice(0, 4096);
  if (response.statusCode >= 500) {
    throw new OciError('UNAVAILABLE', `registry ${registry} answered ${response.statusCode}`, { status: 502 });
  }
  res.writeHead(response.statusCode, {
    ...API_VERSION_HEADER,
    'content-type': 'application/json',
    ...relayableHeaders(response.headers),
    'content-length': Buffer.byteLength(text),
  });
  res.end(text);
  return undefined;
}

/**
 * Relays bytes [range.start, range.end] as the named registry sends them, each part once it has
 * matched the verified bytes stored here: a registry that does not hold the blob gets the client
 * a 502 (or, after the first match, a cut response) and never a wrong byte. False when the
 * registry refused (relayed to the client).
 */
async function compareWithStored(
  res: ServerResponse,
  named: NamedBlob,
  task: BlobTask,
  range: ByteRange,
  partial: boolean,
): Promise<boolean> {
  const answer = await askRegistry(res, named, partial ? range : undefined);
  if (!answer) return false;
  const { registry } = parseBlobUrl(named.url);
  const count = range.end - range.start + 1;
  let position = answer.offset;
  let sent = 0;
  try {
    for await (const chunk of answer.body as AsyncIterable<Buffer>) {
      const from = Math.max(position, range.start);
      const to = Math.min(position + chunk.length, range.end + 1);
      position += chunk.length;
      if (to <= from) continue;
      const part = chunk.subarray(from - (position - chunk.length), to - (position - chunk.length));
      const stored = Buffer.allocUnsafe(part.length);
      const read = await task.blob.read(stored, from, part.length);
      if (read !== part.length || !stored.equals(part)) {
        throw new OciError('UNAVAILABLE', `registry ${registry} sent bytes ${from}-${to - 1} that are not those of ${task.digest}`, {
          status: 502,
        });
      }
      if (!res.headersSent) writeBlobHead(res, task.digest, task.size, partial ? range : undefined);
      await writeChunk(res, part);
      sent += part.length;
      if (position > range.end) break;
    }
  } finally {
    answer.body.destroy();
  }
  if (sent !== count) {
    throw new OciError('UNAVAILABLE', `registry ${registry} sent ${sent} of the ${count} bytes asked for of ${task.digest}`, {
      status: 502,
    });
  }
  if (!res.headersSent) writeBlobHead(res, task.digest, task.size, partial ? range : undefined); // a zero-byte blob
  res.end();
  return true;
}

/**
 * Spools the named registry's whole blob, checks it against the digest, then sends the part the
 * client asked for from the spool. False when the registry refused (relayed to the client).
 */
async function spoolAndServe(
  res: ServerResponse,
  named: NamedBlob,
  rangeHeader: string | undefined,
  digest: string,
  deps: NamedRegistryDeps,
): Promise<boolean> {
  const answer = await askRegistry(res, named);
  if (!answer) return false;
  const { registry } = parseBlobUrl(named.url);
  let file: SpoolFile | undefined;
  try {
    file = await deps.spool.create(answer.length).catch((error: unknown) => {
      if (error instanceof BlobTooLargeError) throw new OciError('UNAVAILABLE', error.message, { status: 502 });
      throw error;
    });
    const { algorithm } = parseDigest(digest);
    const hash = createStreamingHash(algorithm);
    let received = 0;
    for await (const chunk of answer.body as AsyncIterable<Buffer>) {
      if (received + chunk.length > answer.length) {
        throw new OciError('UNAVAILABLE', `registry ${registry} sent more than the ${answer.length} bytes it announced`, { status: 502 });
      }
      await hash.update(chunk);
      await file.handle.write(chunk, 0, chunk.length, received);
      received += chunk.length;
    }
    const actual = `${algorithm}:${hash.hex()}`;
    if (received !== answer.length || actual !== digest) {
      throw new OciError('UNAVAILABLE', `registry ${registry} sent ${received} bytes that hash to ${actual}, not the blob ${digest}`, {
        status: 502,
      });
    }
    // Verified: the range is judged against the blob's true size now.
    const asked = parseRange(rangeHeader, received);
    if (asked.kind === 'invalid') throw new OciError('RANGE_INVALID', asked.reason, { status: 400 });
    if (asked.kind === 'unsatisfiable') {
      throw new OciError('RANGE_INVALID', asked.reason ?? `range not satisfiable for a blob of ${received} bytes`, {
        headers: { 'content-range': `bytes */${received}` },
      });
    }
    // One range is answered as asked; several get the whole blob (RFC 9110 lets a server ignore Range).
    const range = asked.kind === 'ranges' && asked.ranges.length === 1 ? itemAt(asked.ranges, 0) : undefined;
    writeBlobHead(res, digest, received, range);
    await sendSpooled(res, file, range ?? { start: 0, end: received - 1 });
    res.end();
    return true;
  } catch (error) {
    if (!(error instanceof ClientGoneError))
      deps.log.warn({ url: named.url.href, err: (error as Error).message }, 'blob from the named registry refused');
    throw error;
  } finally {
    answer.body.destroy();
    await file?.discard();
  }
}

async function sendSpooled(res: ServerResponse, file: SpoolFile, range: ByteRange): Promise<void> {
  const count = range.end - range.start + 1;
  if (count <= 0) return;
  const sent = await sendFileRange(res, file.handle.fd, range.start, count).catch(() => {
    throw new ClientGoneError();
  });
  if (sent) return;
  for (let position = range.start; position <= range.end;) {
    const length = Math.min(READ_CHUNK, range.end - position + 1);
    const buffer = Buffer.allocUnsafe(length);
    const { bytesRead } = await file.handle.read(buffer, 0, length, position);
    if (bytesRead !== length) throw new Error(`short read of a spooled blob at ${position}`);
    await writeChunk(res, buffer);
    position += length;
  }
}

/** The registry delivered the blob verified: it becomes a source of the copy stored here, if there is one. */
async function recordSource(deps: NamedRegistryDeps, digest: string, source: BlobSource): Promise<void> {
  const lease = deps.tasks.lease(digest);
  if (!lease) return;
  try {
    await lease.task.blob.addSource(source);
  } catch (error) {
    deps.log.warn({ digest, err: (error as Error).message }, 'could not record a further source of a blob');
  } finally {
    lease.release();
  }
}

/**
 * Sends bytes [start, end] of the blob as the registry answers a Range request for them, with
 * the client's credentials (the response's head is already out: any failure cuts it short).
 */
export async function relayRangeFromRegistry(
  res: ServerResponse,
  blobUrl: URL,
  authorization: string | undefined,
  start: number,
  end: number,
  transport: RegistryTransport,
  counts: OriginReadCounts,
): Promise<void> {
  const headers: Record<string, string> = { range: `bytes=${start}-${end}` };
  if (authorization) headers.authorization = authorization;
  counts.sent();
  const response = await transport.send(blobUrl, { headers });
  const answered = String(response.headers['content-range'] ?? '');
  if (response.statusCode !== 206 || !answered.startsWith(`bytes ${start}-${end}/`)) {
    response.body.destroy();
    throw new Error(`registry answered bytes ${start}-${end} of ${blobUrl.pathname} with ${response.statusCode} "${answered}"`);
  }
  const expected = end - start + 1;
  let sent = 0;
  for await (const chunk of response.body as AsyncIterable<Buffer>) {
    sent += chunk.length;
    if (sent > expected) throw new Error(`registry sent more than bytes ${start}-${end}`);
    await writeChunk(res, chunk);
  }
  if (sent !== expected) throw new Error(`registry sent ${sent} of bytes ${start}-${end}`);
}
