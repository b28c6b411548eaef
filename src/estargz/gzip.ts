import { createGunzip, gunzipSync } from 'node:zlib';
import { EstargzError } from './errors.js';
import { itemAt } from '../common/indexing.js';

export const GZIP_MAGIC = [0x1f, 0x8b, 0x08] as const;

export function isGzip(head: Uint8Array): boolean {
  return head.length >= 3 && head[0] === GZIP_MAGIC[0] && head[1] === GZIP_MAGIC[1] && head[2] === GZIP_MAGIC[2];
}

/**
 * Decompresses gzip members from `compressed` until `want` bytes are out, then stops, so a
 * chunk read costs only what it needs and a crafted "gzip bomb" cannot inflate without bound.
 * Returns fewer bytes only if the members end first.
 */
export async function inflatePrefix(compressed: Buffer, want: number, what: string): Promise<Buffer> {
  const gunzip = createGunzip({ chunkSize: Math.min(Math.max(want, 16 * 1024), 1 << 20) });
  const parts: Buffer[] = [];
  let got = 0;
  try {
    gunzip.end(compressed);
    for await (const piece of gunzip as AsyncIterable<Buffer>) {
      parts.push(piece);
      got += piece.length;
      if (got >= want) break; // leaving the loop destroys the stream
    }
  } catch (error) {
    throw new EstargzError('GZIP', `${what}: ${(error as Error).message}`, { cause: error });
  }
  const all = parts.length === 1 ? itemAt(parts, 0) : Buffer.concat(parts);
  return all.subarray(0, Math.min(want, all.length));
}

/** Decompresses a small, complete gzip stream with an output cap (the TOC member). */
export function gunzipCapped(compressed: Buffer, maxOutput: number, what: string): Buffer {
  try {
    return gunzipSync(compressed, { maxOutputLength: maxOutput });
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === 'ERR_BUFFER_TOO_LARGE' || error instanceof RangeError) {
      throw new EstargzError('TOC_TOO_LARGE', `${what} decompresses to more than ${maxOutput} bytes`);
    }
    throw new EstargzError('GZIP', `${what}: ${(error as Error).message}`, { cause: error });
  }
}
