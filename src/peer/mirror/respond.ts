import type { ServerResponse } from 'node:http';
import { OciError } from '../../oci/errors.js';
import { contentRange, type ByteRange } from '../http-range.js';

export const API_VERSION_HEADER = { 'docker-distribution-api-version': 'registry/2.0' };

export const BLOB_CONTENT_TYPE = 'application/octet-stream';

/** Headers every answer with a blob's bytes carries. */
export function blobHeaders(digest: string): Record<string, string> {
  return { ...API_VERSION_HEADER, 'docker-content-digest': digest, 'accept-ranges': 'bytes', etag: `"${digest}"` };
}

/** The status line and headers of a blob's bytes: the whole blob (200), or one range of it (206). */
export function writeBlobHead(res: ServerResponse, digest: string, size: number, range?: ByteRange): void {
  const headers = { ...blobHeaders(digest), 'content-type': BLOB_CONTENT_TYPE };
  if (!range) return void res.writeHead(200, { ...headers, 'content-length': size });
  res.writeHead(206, { ...headers, 'content-range': contentRange(range, size), 'content-length': range.end - range.start + 1 });
}

export function sendOciError(res: ServerResponse, error: OciError, method = 'GET'): void {
  if (res.headersSent) {
    res.destroy(error);
    return;
  }
  const body = JSON.stringify(error.toJSON());
  res.writeHead(error.status, {
    ...API_VERSION_HEADER,
    ...error.headers,
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(body),
  });
  res.end(method === 'HEAD' ? undefined : body);
}

/**
 * Writes a chunk and waits for the socket to drain; rejects if the client went away.
 * `onWritten` runs once the chunk's bytes are no longer needed (handed to the kernel, or dropped
 * with the connection): where a pooled piece buffer's hold is let go.
 */
export function writeChunk(res: ServerResponse, chunk: Buffer | string, onWritten?: () => void): Promise<void> {
  if (res.destroyed || res.writableEnded) {
    onWritten?.(); // nothing was queued
    return Promise.reject(new ClientGoneError());
  }
  if (res.write(chunk, onWritten)) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const done = (error?: Error) => {
      res.off('drain', onDrain);
      res.off('close', onClose);
      if (error) reject(error);
      else resolve();
    };
    const onDrain = () => done();
    const onClose = () => done(new ClientGoneError());
    res.on('drain', onDrain);
    res.on('close', onClose);
  });
}

export class ClientGoneError extends Error {
  override name = 'ClientGoneError';
  constructor() {
    super('client closed the connection');
  }
}
