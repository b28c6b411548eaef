import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';
import { EstargzError } from './errors.js';
import { isGzip } from './gzip.js';
import { isZstd, zstdDecompressStream } from './zstd.js';

/**
 * The uncompressed tar stream of a layer given as plain tar, gzip or zstd (detected by its magic
 * bytes, like Go's Build). Several gzip members or zstd frames are read as one stream.
 */
export async function* plainTarStream(input: AsyncIterable<Buffer>): AsyncGenerator<Buffer> {
  const source = input[Symbol.asyncIterator]();
  const head: Buffer[] = [];
  let headLength = 0;
  let ended = false;
  while (headLength < 4) {
    const next = await source.next();
    if (next.done) {
      ended = true;
      break;
    }
    head.push(next.value);
    headLength += next.value.length;
  }
  async function* replay(): AsyncGenerator<Buffer> {
    yield* head;
    if (!ended) for (let next = await source.next(); !next.done; next = await source.next()) yield next.value;
  }
  const magic = Buffer.concat(head).subarray(0, 4);
  if (isZstd(magic)) {
    yield* zstdDecompressStream(replay(), 'input is not a valid zstd stream');
    return;
  }
  if (!isGzip(magic)) {
    yield* replay();
    return;
  }
  const gunzip = createGunzip({ chunkSize: 1 << 20 });
  const feeding = pipeline(Readable.from(replay()), gunzip);
  feeding.catch(() => undefined); // its failure surfaces through the gunzip iteration below
  try {
    for await (const piece of gunzip as AsyncIterable<Buffer>) yield piece;
    await feeding;
  } catch (error) {
    if (error instanceof EstargzError) throw error;
    throw new EstargzError('INPUT', `input is not a valid gzip stream: ${(error as Error).message}`, { cause: error });
  } finally {
    gunzip.destroy();
  }
}
