import { open, type FileHandle } from 'node:fs/promises';
import { EstargzError } from './errors.js';

/**
 * Random access to a blob: a local file now, an HTTP Range fetcher (registry or peer) later.
 * read() must return exactly `length` bytes or throw.
 */
export interface RangeSource {
  readonly size: number;
  /**
   * `background` marks a read no one waits for (a cache filling in); sources that cannot say so
   * ignore it. `checkedPieces`: bytes the source checked itself only (a Starling peer otherwise
   * sends parts of pieces it could not check yet): asked again after a chunk failed its digest.
   */
  read(offset: number, length: number, priority?: 'demand' | 'background', options?: { checkedPieces?: boolean }): Promise<Buffer>;
  close?(): Promise<void>;
}

/** Checks a request against the source size; every RangeSource implementation should call it. */
export function checkRange(size: number, offset: number, length: number): void {
  if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0 || offset + length > size) {
    throw new EstargzError('INPUT', `range [${offset}, +${length}) is outside the blob of ${size} bytes`);
  }
}

/** A RangeSource over a local file, read with positioned reads (pread). Close it when done. */
export async function fileSource(path: string): Promise<RangeSource & { close(): Promise<void> }> {
  const handle: FileHandle = await open(path, 'r');
  try {
    const { size } = await handle.stat();
    return {
      size,
      async read(offset, length) {
        checkRange(size, offset, length);
        const buffer = Buffer.allocUnsafe(length);
        let done = 0;
        while (done < length) {
          const { bytesRead } = await handle.read(buffer, done, length - done, offset + done);
          if (bytesRead === 0) throw new EstargzError('INPUT', `${path} shrank while reading at offset ${offset + done}`);
          done += bytesRead;
        }
        return buffer;
      },
      close: () => handle.close(),
    };
  } catch (error) {
    await handle.close();
    throw error;
  }
}

/** A RangeSource over bytes in memory (tests, small blobs). */
export function bufferSource(bytes: Buffer): RangeSource {
  return {
    size: bytes.length,
    async read(offset, length) {
      checkRange(bytes.length, offset, length);
      return bytes.subarray(offset, offset + length);
    },
  };
}

/** Streams [offset, offset+length) in pieces of at most pieceSize bytes. */
export async function* readRangePieces(source: RangeSource, offset: number, length: number, pieceSize = 4 << 20): AsyncGenerator<Buffer> {
  for (let done = 0; done < length;) {
    const n = Math.min(pieceSize, length - done);
    yield await source.read(offset + done, n);
    done += n;
  }
}
