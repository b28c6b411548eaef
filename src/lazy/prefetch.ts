// The start-up prefetch: [0, landmark) of the blob — the prioritized files — fetched with one
// Range request and cut into verified chunks as the bytes stream in (memory stays at about one
// compressed chunk, whatever the size of the range).
import type { ChunkRef, EstargzReader } from '../estargz/index.js';
import type { ChunkFetcher } from './chunk-fetcher.js';
import type { StreamingRangeSource } from './http-source.js';
import { itemAt } from '../common/indexing.js';

export interface PrefetchResult {
  /** Bytes of the blob fetched. */
  length: number;
  /** Chunks verified and stored. */
  chunks: number;
  /** Chunks that failed to decode or verify: left out of the cache (a read of them gets EIO). */
  failed: Error[];
}

/** Chunks decoded at once; the stream waits beyond that (bounded memory on fast links). */
const DECODE_AHEAD = 8;

/**
 * The range to prefetch: up to the `.prefetch.landmark` when the layer has one; none when it has
 * `.no.prefetch.landmark`; else [0, prefetchSize) when given (stargz-snapshotter's prefetch_size).
 * Extended to the end of the last chunk it touches, so no chunk is left half-fetched.
 */
export function prefetchLength(reader: EstargzReader, prefetchSize = 0): number {
  if (reader.lookup('.no.prefetch.landmark')) return 0;
  const limit = reader.prefetchRange()?.length ?? Math.min(prefetchSize, reader.payloadEnd);
  let end = limit;
  for (const chunk of reader.chunks) if (chunk.offset < limit) end = Math.max(end, chunk.end);
  return end;
}

export async function prefetch(
  reader: EstargzReader,
  source: StreamingRangeSource,
  fetcher: ChunkFetcher,
  length: number,
): Promise<PrefetchResult> {
  const result: PrefetchResult = { length: 0, chunks: 0, failed: [] };
  if (length <= 0) return result;
  const wanted = uniqueByDigest(reader.chunks.filter((c) => c.end <= length && !fetcher.store.has(c.digest)));
  if (wanted.length === 0) return result;
  // Fetch from the first missing chunk: a warm cache (shared across layers) costs nothing.
  const start = itemAt(wanted, 0).offset;
  const end = Math.max(...wanted.map((c) => c.end));
  let buffered: Buffer[] = [];
  let bufferStart = start; // blob offset of buffered[0][0]
  let bufferLength = 0;
  let next = 0;
  const decoding = new Set<Promise<void>>();
  const decode = (chunk: ChunkRef, compressed: Buffer) => {
    const job: Promise<void> = fetcher.accept(chunk, compressed).then(
      () => void result.chunks++,
      (error: unknown) => void result.failed.push(error as Error),
    );
    decoding.add(job);
    void job.then(() => decoding.delete(job));
  };
  for await (const piece of source.stream(start, end - start)) {
    fetcher.countFetched(piece.length);
    buffered.push(piece);
    bufferLength += piece.length;
    for (let chunk = wanted[next]; chunk && chunk.end <= bufferStart + bufferLength; chunk = wanted[next]) {
      next++;
      const all = buffered.length === 1 ? itemAt(buffered, 0) : Buffer.concat(buffered);
      // copy: the slice must not pin the whole buffer while the chunk is decoded
      decode(chunk, Buffer.from(all.subarray(chunk.offset - bufferStart, chunk.end - bufferStart)));
      const keepFrom = (wanted[next]?.offset ?? bufferStart + bufferLength) - bufferStart;
      buffered = keepFrom < all.length ? [all.subarray(keepFrom)] : [];
      bufferLength = all.length - Math.min(keepFrom, all.length);
      bufferStart += Math.min(keepFrom, all.length);
    }
    while (decoding.size >= DECODE_AHEAD) await Promise.race(decoding);
  }
  await Promise.all(decoding);
  result.length = end - start;
  return result;
}

function uniqueByDigest(chunks: ChunkRef[]): ChunkRef[] {
  const seen = new Set<string>();
  return chunks.filter((c) => (seen.has(c.digest) ? false : (seen.add(c.digest), true))).sort((a, b) => a.offset - b.offset);
}
