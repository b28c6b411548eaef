// Gets chunks into the ChunkStore: fetches compressed ranges from the source (adjacent chunks
// in one Range request), decompresses each chunk, checks it against its chunkDigest and only
// then stores it. A chunk whose bytes do not match is an error for whoever asked: never data.
import { createHash } from 'node:crypto';
import { EstargzError, type ChunkRef, type RangeSource } from '../estargz/index.js';
import { inflatePrefix } from '../estargz/gzip.js';
import { zstdDecompressPrefix } from '../estargz/zstd.js';
import { shorten } from '../estargz/names.js';
import type { ChunkStore } from './chunk-store.js';
import type { FileSegments } from '../fuse/index.js';
import { itemAt } from '../common/indexing.js';
import type { ReadPriority } from '../rpc/mirror-api.js';
import { FetchPriority } from './fetch-priority.js';

export interface FetchStats {
  /** Compressed bytes fetched for chunks (on demand, prefetch and background). */
  bytesFetched: number;
  /** Chunks fetched, verified and stored. */
  chunksFetched: number;
  /** Chunk reads answered from the store without fetching. */
  cacheHits: number;
  /** Chunks whose content did not match the TOC. */
  digestMismatches: number;
}

export interface ChunkFetcherOptions {
  /** Largest compressed span fetched in one request when chunks are adjacent (default 8 MiB). */
  maxSpan?: number;
  /**
   * Chunks of the same file fetched ahead (without waiting for them) when a read reaches into the
   * second half of a chunk: sequential readers then find the next chunk on its way. Default 2; 0 disables.
   */
  readAheadChunks?: number;
  /** On-demand fetches register here, so that background fetches (of every layer sharing it) yield to them. */
  priority?: FetchPriority;
  /**
   * Chunks of the same file already in the store read into memory ahead (the same trigger):
   * several disk reads in flight keep a sequential reader fed (one 4 MiB read at a time reached
   * about half the disk's speed here). Default 4; 0 disables.
   */
  preloadChunks?: number;
}

export class ChunkFetcher {
  readonly stats: FetchStats = { bytesFetched: 0, chunksFetched: 0, cacheHits: 0, digestMismatches: 0 };
  /** In-flight fetches by chunk digest: one fetch per chunk, however many readers wait. */
  private readonly inflight = new Map<string, Promise<Buffer>>();
  /** Chunks whose running fetch is a background one (a read on demand does not wait for it). */
  private readonly inflightInBackground = new Set<string>();
  readonly priority: FetchPriority;
  private readonly maxSpan: number;
  private readonly readAheadChunks: number;
  private readonly preloadChunks: number;

  constructor(
    private readonly source: RangeSource,
    readonly store: ChunkStore,
    private readonly format: 'gzip' | 'zstd',
    options: ChunkFetcherOptions = {},
  ) {
    this.maxSpan = options.maxSpan ?? 8 << 20;
    this.priority = options.priority ?? new FetchPriority({ backgroundSlots: 2, quietMs: 100 });
    this.readAheadChunks = options.readAheadChunks ?? 2;
    this.preloadChunks = options.preloadChunks ?? 4;
  }

  /**
   * [offset, offset+length) of a file given its chunks: the missing chunks are fetched together
   * (adjacent ones in one request), the others read from the store.
   */
  async readFile(chunks: readonly ChunkRef[], offset: number, length: number): Promise<Buffer> {
    const end = offset + length;
    const needed = chunks.filter((c) => c.chunkOffset < end && c.chunkOffset + c.chunkSize > offset);
    const missing = needed.filter((c) => !this.store.has(c.digest));
    this.readAhead(chunks, needed, end);
    const fetched = new Map<ChunkRef, Buffer>();
    if (missing.length > 0) {
      const data = await this.ensure(missing, 'demand'); // one buffer per chunk, in order
      missing.forEach((chunk, i) => fetched.set(chunk, itemAt(data, i)));
    }
    const parts = await Promise.all(
      needed.map(async (c) => {
        const from = Math.max(offset, c.chunkOffset) - c.chunkOffset;
        const to = Math.min(end, c.chunkOffset + c.chunkSize) - c.chunkOffset;
        const data = fetched.get(c);
        return data ? data.subarray(from, to) : this.readChunk(c, from, to - from);
      }),
    );
    return parts.length === 1 ? itemAt(parts, 0) : Buffer.concat(parts);
  }

  /**
   * The bytes readFile would return, as ranges of stored chunk files for the FUSE reply to read
   * itself; undefined unless every chunk needed is on disk (the caller then uses readFile).
   */
  async fileSegments(chunks: readonly ChunkRef[], offset: number, length: number): Promise<FileSegments | undefined> {
    const end = offset + length;
    const needed = chunks.filter((c) => c.chunkOffset < end && c.chunkOffset + c.chunkSize > offset);
    if (needed.length === 0 || !needed.every((c) => this.store.has(c.digest))) return undefined;
    this.readAhead(chunks, needed, end, false);
    const pins = await Promise.all(needed.map((c) => this.store.pin(c.digest, c.chunkSize)));
    const held = pins.filter((pin) => pin !== undefined);
    const release = () => held.forEach((pin) => pin.release());
    if (held.length < pins.length) {
      release();
      return undefined;
    }
    this.stats.cacheHits += needed.length;
    const segments = needed.map((c, i) => {
      const from = Math.max(offset, c.chunkOffset) - c.chunkOffset;
      const to = Math.min(end, c.chunkOffset + c.chunkSize) - c.chunkOffset;
      return { fd: itemAt(held, i).fd, offset: from, length: to - from };
    });
    return { segments, release };
  }

  private readAhead(chunks: readonly ChunkRef[], needed: readonly ChunkRef[], end: number, preload = true): void {
    const last = needed[needed.length - 1];
    const depth = Math.max(this.readAheadChunks, this.preloadChunks);
    if (!last || depth === 0 || end < last.chunkOffset + last.chunkSize / 2) return;
    const index = chunks.indexOf(last);
    const next = chunks.slice(index + 1, index + 1 + depth);
    const ahead = next.slice(0, this.readAheadChunks).filter((c) => !this.store.has(c.digest) && !this.inflight.has(c.digest));
    if (ahead.length > 0) this.fill(ahead, 'demand').catch(() => {}); // the read that needs them will see any error
    // Stored ones: bring them into memory while this one is being served, or only into the page
    // cache when replies read the files themselves.
    for (const c of next.slice(0, this.preloadChunks)) {
      if (!this.store.has(c.digest)) continue;
      if (preload) this.store.preload(c.digest, c.chunkSize);
      else this.store.warm(c.digest);
    }
  }

  /** `length` bytes from `offset` in a chunk (fetched if needed). */
  async readChunk(chunk: ChunkRef, offset: number, length: number): Promise<Buffer> {
    const cached = await this.store.read(chunk.digest, offset, length, chunk.chunkSize);
    if (cached) {
      this.stats.cacheHits++;
      return cached;
    }
    const data = itemAt(await this.ensure([chunk], 'demand'), 0);
    return data.subarray(offset, offset + length);
  }

  /**
   * Makes sure every chunk is in the store; returns each chunk's bytes (from the fetch, or read
   * back from the store). On-demand calls are tracked so background work can yield to them.
   */
  async ensure(chunks: readonly ChunkRef[], priority: ReadPriority): Promise<Buffer[]> {
    return this.tracked(priority, async () => {
      const started = this.start(chunks, priority);
      return Promise.all(chunks.map((chunk) => started.get(chunk) ?? this.fromStore(chunk, priority)));
    });
  }

  /** Like ensure() without reading anything back: for prefetch and background fetch. */
  async fill(chunks: readonly ChunkRef[], priority: ReadPriority): Promise<void> {
    await this.tracked(priority, async () => {
      await Promise.all(this.start(chunks, priority).values());
    });
  }

  /**
   * Starts fetches for the chunks not stored yet; returns the running fetch of each such chunk. A
   * read a workload waits for does not wait on a background fetch of its chunks: the peer may have
   * its seed put that one off while other nodes read, so it asks again, on demand.
   */
  private start(chunks: readonly ChunkRef[], priority: ReadPriority): Map<ChunkRef, Promise<Buffer>> {
    const running = new Map<ChunkRef, Promise<Buffer>>();
    const missing: ChunkRef[] = [];
    for (const chunk of chunks) {
      const inflight = this.inflight.get(chunk.digest);
      const overtake = priority === 'demand' && this.inflightInBackground.has(chunk.digest);
      if (inflight && !overtake) running.set(chunk, inflight);
      else if (overtake || !this.store.has(chunk.digest)) missing.push(chunk);
    }
    for (const span of spans(missing, this.maxSpan)) {
      const fetched = this.fetchSpan(span, priority);
      span.forEach((chunk, i) => running.set(chunk, itemAt(fetched, i)));
    }
    // Chunks sharing a digest with one being fetched wait for that fetch.
    for (const chunk of missing) {
      const shared = this.inflight.get(chunk.digest);
      if (shared && !running.has(chunk)) running.set(chunk, shared);
    }
    return running;
  }

  private tracked<T>(priority: ReadPriority, fn: () => Promise<T>): Promise<T> {
    return priority === 'demand' ? this.priority.demand(fn) : fn();
  }

  /** Decodes, verifies and stores one chunk whose compressed bytes start at chunk.offset. */
  async accept(chunk: ChunkRef, compressed: Buffer): Promise<Buffer> {
    const data = await decodeChunk(this.format, chunk, compressed).catch((error: unknown) => {
      if (error instanceof EstargzError && error.code === 'CHUNK_DIGEST') this.stats.digestMismatches++;
      throw error;
    });
    await this.store.write(chunk.digest, data);
    this.stats.chunksFetched++;
    return data;
  }

  /** Counts bytes fetched outside fetchSpan (the streaming prefetch). */
  countFetched(bytes: number): void {
    this.stats.bytesFetched += bytes;
  }

  private async fromStore(chunk: ChunkRef, priority: ReadPriority): Promise<Buffer> {
    const data = await this.store.read(chunk.digest, 0, chunk.chunkSize, chunk.chunkSize);
    if (data) return data;
    return itemAt(await this.ensure([chunk], priority), 0); // vanished from disk: fetch again
  }

  private fetchSpan(span: ChunkRef[], priority: ReadPriority): Array<Promise<Buffer>> {
    const start = itemAt(span, 0).offset;
    const end = itemAt(span, span.length - 1).end;
    const read = (checkedPieces: boolean) =>
      this.source.read(start, end - start, priority, { checkedPieces }).then((bytes) => {
        this.stats.bytesFetched += bytes.length;
        return bytes;
      });
    const compressed = read(false);
    // A peer may have sent part of a piece it could not check: a chunk that fails its digest is
    // read once more, from pieces the peer checked (a parent that flips bits fails only there).
    let checked: Promise<Buffer> | undefined;
    const accept = async (chunk: ChunkRef, bytes: Buffer) => {
      try {
        return await this.accept(chunk, bytes.subarray(chunk.offset - start, chunk.end - start));
      } catch (error) {
        if (!(error instanceof EstargzError && error.code === 'CHUNK_DIGEST')) throw error;
        const again = await (checked ??= read(true));
        return this.accept(chunk, again.subarray(chunk.offset - start, chunk.end - start));
      }
    };
    return span.map((chunk) => {
      const done: Promise<Buffer> = compressed
        .then((bytes) => accept(chunk, bytes))
        .finally(() => {
          // An on-demand fetch that overtook this one is the chunk's fetch now.
          if (this.inflight.get(chunk.digest) !== done) return;
          this.inflight.delete(chunk.digest);
          this.inflightInBackground.delete(chunk.digest);
        });
      this.inflight.set(chunk.digest, done);
      if (priority === 'background') this.inflightInBackground.add(chunk.digest);
      else this.inflightInBackground.delete(chunk.digest);
      done.catch(() => {}); // each waiter sees the error; none is left unhandled
      return done;
    });
  }
}

/** Groups chunks (any order) into runs that are adjacent in the blob and at most maxSpan long. */
export function spans(chunks: readonly ChunkRef[], maxSpan: number): ChunkRef[][] {
  const sorted = [...new Map(chunks.map((c) => [c.digest, c])).values()].sort((a, b) => a.offset - b.offset);
  const out: ChunkRef[][] = [];
  for (const chunk of sorted) {
    const last = out[out.length - 1];
    const [head, tail] = [last?.[0], last?.[last.length - 1]];
    if (last && head && tail && tail.end === chunk.offset && chunk.end - head.offset <= maxSpan) last.push(chunk);
    else out.push([chunk]);
  }
  return out;
}

/** The chunk's uncompressed bytes, checked against its digest (EstargzError CHUNK_DIGEST if not). */
export async function decodeChunk(format: 'gzip' | 'zstd', chunk: ChunkRef, compressed: Buffer): Promise<Buffer> {
  const where = `chunk [${chunk.chunkOffset}, +${chunk.chunkSize}) of "${shorten(chunk.file)}" at blob offset ${chunk.offset}`;
  const want = chunk.innerOffset + chunk.chunkSize;
  const plain = format === 'zstd' ? zstdDecompressPrefix(compressed, want, where) : await inflatePrefix(compressed, want, where);
  if (plain.length < want) throw new EstargzError('CHUNK', `${where}: compressed data ends after ${plain.length} of ${want} bytes`);
  const data = plain.subarray(chunk.innerOffset, want);
  const actual = `sha256:${createHash('sha256').update(data).digest('hex')}`;
  if (actual !== chunk.digest) {
    throw new EstargzError('CHUNK_DIGEST', `${where}: content digest ${actual} does not match the TOC's ${chunk.digest}`);
  }
  return data;
}
