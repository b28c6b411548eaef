import { createHash } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { pipeline } from 'node:stream/promises';
import type { Readable } from 'node:stream';
import { UserError } from '../common/errors.js';
import type { Descriptor } from './oci-types.js';
import type { ImageStore } from './store.js';

/**
 * The blob's bytes as they stream, checked against its descriptor: a mismatch in size or digest
 * fails the iteration at the end, so nothing built from bad bytes is kept.
 */
export async function* verifiedBlob(store: ImageStore, blob: Descriptor, onBytes?: (n: number) => void): AsyncGenerator<Buffer> {
  const stream: Readable = await store.openBlob(blob.digest);
  const hash = createHash('sha256');
  let size = 0;
  for await (const piece of stream as AsyncIterable<Buffer>) {
    hash.update(piece);
    size += piece.length;
    onBytes?.(size);
    if (size > blob.size) break;
    yield piece;
  }
  const digest = `sha256:${hash.digest('hex')}`;
  if (size !== blob.size || digest !== blob.digest) {
    stream.destroy();
    throw new UserError(`${store.name}: blob ${blob.digest} came as ${size} bytes with digest ${digest}, expected ${blob.size} bytes`);
  }
}

/** Copies a blob to a local file, verified. */
export async function downloadBlob(store: ImageStore, blob: Descriptor, path: string): Promise<string> {
  await pipeline(verifiedBlob(store, blob), createWriteStream(path));
  return path;
}

/** A small blob (manifest, config) in memory, verified and capped. */
export async function readSmallBlob(store: ImageStore, blob: Descriptor, what: string, limit = 16 << 20): Promise<Buffer> {
  if (blob.size > limit) throw new UserError(`${store.name}: ${what} ${blob.digest} is ${blob.size} bytes, over the ${limit}-byte limit`);
  const parts: Buffer[] = [];
  for await (const piece of verifiedBlob(store, blob)) parts.push(piece);
  return Buffer.concat(parts);
}
