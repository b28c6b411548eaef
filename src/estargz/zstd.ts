import { createRequire } from 'node:module';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { EstargzError } from './errors.js';

/*
 * zstd through zstd-napi (libzstd). It is a CommonJS native addon, loaded with require; its
 * resolved path is exported so compression worker threads can load the same file.
 */
const require = createRequire(import.meta.url);
export const ZSTD_MODULE_PATH = require.resolve('zstd-napi');
const zstd = require('zstd-napi') as typeof import('zstd-napi');
const binding = require('zstd-napi/binding.js') as typeof import('zstd-napi/binding.js');

export const ZSTD_MAGIC = [0x28, 0xb5, 0x2f, 0xfd] as const;
/** Go's zstd.SpeedDefault corresponds to libzstd level 3. */
export const DEFAULT_ZSTD_LEVEL = 3;
export const MAX_ZSTD_LEVEL = 19;

export function isZstd(head: Uint8Array): boolean {
  return head.length >= 4 && ZSTD_MAGIC.every((byte, i) => head[i] === byte);
}

export function zstdCompress(data: Uint8Array, level: number): Buffer {
  return zstd.compress(data, { compressionLevel: level });
}

/**
 * Decompresses zstd frames until `want` bytes are out, then stops (the chunk-read analogue of
 * inflatePrefix): a chunk read costs what it needs, and a crafted frame cannot inflate unbounded.
 */
export function zstdDecompressPrefix(compressed: Buffer, want: number, what: string): Buffer {
  const dctx = new binding.DCtx();
  const out = Buffer.allocUnsafe(want);
  let got = 0;
  let input = compressed.subarray(0);
  try {
    while (got < want && input.length > 0) {
      const [, produced, consumed] = dctx.decompressStream(out.subarray(got), input);
      got += produced;
      input = input.subarray(consumed);
      if (produced === 0 && consumed === 0) break; // truncated: zstd needs input it will not get
    }
  } catch (error) {
    throw new EstargzError('ZSTD', `${what}: ${(error as Error).message}`, { cause: error });
  }
  return out.subarray(0, got);
}

/** Decompresses a small, complete zstd stream with an output cap (the zstd:chunked TOC). */
export function zstdDecompressCapped(compressed: Buffer, maxOutput: number, what: string): Buffer {
  const dctx = new binding.DCtx();
  const parts: Buffer[] = [];
  let total = 0;
  let input = compressed.subarray(0);
  let pending = 1; // libzstd's hint: 0 once a frame is complete
  try {
    while (input.length > 0 || pending !== 0) {
      const out = Buffer.allocUnsafe(1 << 16);
      const [hint, produced, consumed] = dctx.decompressStream(out, input);
      pending = hint;
      input = input.subarray(consumed);
      total += produced;
      if (total > maxOutput) throw new EstargzError('TOC_TOO_LARGE', `${what} decompresses to more than ${maxOutput} bytes`);
      parts.push(out.subarray(0, produced));
      if (produced === 0 && consumed === 0) {
        if (pending !== 0) throw new Error('data ends inside a frame');
        break;
      }
    }
  } catch (error) {
    if (error instanceof EstargzError) throw error;
    throw new EstargzError('ZSTD', `${what}: ${(error as Error).message}`, { cause: error });
  }
  return Buffer.concat(parts);
}

/** Streams the decompression of a zstd stream (several frames, skippable frames skipped). */
export async function* zstdDecompressStream(input: AsyncIterable<Buffer>, what: string): AsyncGenerator<Buffer> {
  const decompress = new zstd.DecompressStream();
  const feeding = pipeline(Readable.from(input), decompress);
  feeding.catch(() => undefined); // surfaces through the iteration below
  try {
    for await (const piece of decompress as AsyncIterable<Buffer>) yield piece;
    await feeding;
  } catch (error) {
    if (error instanceof EstargzError) throw error;
    throw new EstargzError('ZSTD', `${what}: ${(error as Error).message}`, { cause: error });
  } finally {
    decompress.destroy();
  }
}
