import type { IncomingMessage, ServerResponse } from 'node:http';
import { createStreamingHash } from '../../common/hashing.js';
import type { Logger } from '../../common/log.js';
import { parseBlobUrl } from '../../oci/blob-url.js';
import { parseDigest } from '../../oci/digest.js';
import { OciError } from '../../oci/errors.js';
import type { RegistryTransport } from '../../oci/transport.js';
import type { BlobSource } from '../../storage/stored-blob.js';
import { readableAnonymously } from '../access/checker.js';
import { relayableHeaders } from '../sources/origin-source.js';
import type { TaskManager } from '../task-manager.js';
import { passThrough } from './manifests.js';
import { API_VERSION_HEADER, ClientGoneError, writeChunk } from './respond.js';

export interface NamedRegistryDeps {
  transport: RegistryTransport;
  tasks: TaskManager;
  log: Logger;
}

/**
 * Serves a blob request from the registry the client names, not from this peer's store: the
 * request names a registry that has not shown it holds the blob (access/rule.ts), or asks for a
 * range whose stored bytes have not been verified yet. Nothing of it is stored.
 *
 * A HEAD or a Range request is relayed as the registry answers it: bytes from the registry the
 * client chose, as it would get them without a mirror. A whole-blob GET is hashed as it streams
 * and its last chunk waits for the digest check, so a registry that does not hold the blob never
 * gets a client a complete body; one that does is recorded as a further source of the blob.
 */
export async function serveFromNamedRegistry(
  req: IncomingMessage,
  res: ServerResponse,
  blobUrl: URL,
  deps: NamedRegistryDeps,
): Promise<void> {
  if (req.method === 'HEAD' || req.headers.range !== undefined) return passThrough(req, res, blobUrl, deps.transport);
  const authorization = typeof req.headers.authorization === 'string' ? req.headers.authorization : undefined;
  const location = parseBlobUrl(blobUrl);
  const response = await deps.transport.send(blobUrl, { headers: authorization ? { authorization } : {} });
  if (response.statusCode !== 200) {
    const text = (await response.body.text().catch(() => '')).slice(0, 4096);
    if (response.statusCode >= 500)
      throw new OciError('UNAVAILABLE', `registry ${location.registry} answered ${response.statusCode}`, { status: 502 });
    res.writeHead(response.statusCode, {
      ...API_VERSION_HEADER,
      'content-type': 'application/json',
      ...relayableHeaders(response.headers),
      'content-length': Buffer.byteLength(text),
    });
    return void res.end(text);
  }
  const length = Number(response.headers['content-length']);
  if (!Number.isSafeInteger(length) || length < 0) {
    await response.body.dump().catch(() => undefined);
    throw new OciError('UNAVAILABLE', `registry ${location.registry} sent blob ${location.digest} without a usable Content-Length`, {
      status: 502,
    });
  }
  const { algorithm } = parseDigest(location.digest);
  const hash = createStreamingHash(algorithm);
  res.writeHead(200, {
    ...API_VERSION_HEADER,
    'content-type': 'application/octet-stream',
    'content-length': length,
    'docker-content-digest': location.digest,
  });
  // Each chunk goes out once the next has arrived: the last one waits for the digest check.
  let held: Buffer | undefined;
  let received = 0;
  try {
    for await (const chunk of response.body as AsyncIterable<Buffer>) {
      received += chunk.length;
      if (received > length) throw new Error(`registry ${location.registry} sent more than the ${length} bytes it announced`);
      await hash.update(chunk);
      if (held) await writeChunk(res, held);
      held = chunk;
    }
    const actual = `${algorithm}:${hash.hex()}`;
    if (received !== length || actual !== location.digest) {
      throw new Error(`registry ${location.registry} sent ${received} bytes that hash to ${actual}, not the blob ${location.digest}`);
    }
  } catch (error) {
    response.body.destroy();
    if (!(error instanceof ClientGoneError))
      deps.log.warn({ url: blobUrl.href, err: (error as Error).message }, 'blob from the named registry refused');
    throw error;
  }
  if (held) await writeChunk(res, held);
  res.end();
  await recordSource(deps, location.digest, {
    registry: location.registry,
    repository: location.repository,
    public: !authorization || (await readableAnonymously(deps.transport, blobUrl)),
  });
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
): Promise<void> {
  const headers: Record<string, string> = { range: `bytes=${start}-${end}` };
  if (authorization) headers.authorization = authorization;
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
