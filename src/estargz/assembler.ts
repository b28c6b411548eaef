import { createHash, type Hash } from 'node:crypto';
import { once } from 'node:events';
import type { Writable } from 'node:stream';
import { gzipSync } from 'node:zlib';
import { CompressionPool, type MemberFormat, type MemberJob, type MemberResult } from './compress-pool.js';
import { encodeFooter } from './footer.js';
import { END_OF_ARCHIVE, paddingFor, ustarFileHeader } from './tar.js';
import { TOC_TAR_NAME } from './toc.js';
import { zstdCompress } from './zstd.js';
import { encodeZstdFooter, skippableFrame, SKIPPABLE_HEADER_SIZE } from './zstd-footer.js';
import { itemAt } from '../common/indexing.js';

export interface AssembledBlob {
  diffID: string;
  digest: string;
  size: number;
  uncompressedSize: number;
  tocOffset: number;
  /** zstd:chunked: sha256 of the compressed TOC and "offset:compressed:raw:type", as Go annotates. */
  zstdManifest?: { checksum: string; position: string };
}

/** Called once a chunk's member has its place in the blob: compressed offset and chunk digest. */
export type ChunkPlaced = (offset: number, chunkDigest: string) => void;

interface Member extends MemberJob {
  onPlaced?: ChunkPlaced;
}

/** Members are sent to workers in batches of about this many bytes to amortize messaging. */
const BATCH_BYTES = 1 << 20;
const BATCH_MEMBERS = 256;

/**
 * Lays the uncompressed tar stream out as gzip members (or zstd frames) the way Go's estargz.Writer does: a new
 * member starts exactly where each chunk of file data starts; headers, padding and entries
 * without data go into the member that is open (after the previous chunk). Members are
 * compressed in parallel and written in order, which is when their compressed offsets become
 * known. Memory stays bounded: at most `maxInFlight` batches are held at once.
 */
export class BlobAssembler {
  private parts: Buffer[] = [];
  private partsLength = 0;
  private chunkLength = 0;
  private chunkOpen = false;
  private onPlaced: ChunkPlaced | undefined;
  private batch: Member[] = [];
  private batchBytes = 0;
  private readonly inFlight: { members: Member[]; results: Promise<MemberResult[]> }[] = [];
  private readonly maxInFlight: number;
  private readonly diffHash: Hash = createHash('sha256');
  private readonly blobHash: Hash = createHash('sha256');
  /** Compressed bytes written so far. */
  private written = 0;
  private uncompressed = 0;

  constructor(
    private readonly output: Writable,
    private readonly pool: CompressionPool,
    private readonly format: MemberFormat,
    private readonly level: number,
    /** Header-only runs are split into members of about this size. */
    private readonly memberLimit: number,
  ) {
    this.maxInFlight = pool.size * 2;
  }

  /** Tar bytes that are not chunk data: headers and padding. */
  async appendRaw(bytes: Buffer): Promise<void> {
    if (bytes.length === 0) return;
    this.addBytes(bytes);
    if (this.partsLength >= this.memberLimit) await this.closeMember();
  }

  /** Starts a chunk: it must begin a gzip member, so the open member is closed first. */
  async startChunk(onPlaced: ChunkPlaced): Promise<void> {
    await this.closeMember();
    this.chunkOpen = true;
    this.onPlaced = onPlaced;
  }

  appendChunkData(bytes: Buffer): void {
    this.addBytes(bytes);
    this.chunkLength += bytes.length;
  }

  endChunk(): void {
    this.chunkOpen = false;
  }

  /**
   * Compresses and writes everything still buffered, then the TOC and the footer. `tocJson` is
   * called once every chunk has its offset, and returns the TOC JSON.
   */
  async finish(tocJson: () => Buffer): Promise<AssembledBlob> {
    await this.closeMember();
    await this.submitBatch();
    while (this.inFlight.length > 0) await this.writeOldest();
    const json = tocJson();
    const trailer = this.format === 'zstd' ? await this.writeZstdTrailer(json) : await this.writeGzipTrailer(json);
    return {
      diffID: `sha256:${this.diffHash.digest('hex')}`,
      digest: `sha256:${this.blobHash.digest('hex')}`,
      size: this.written,
      uncompressedSize: this.uncompressed,
      ...trailer,
    };
  }

  /** eStargz: the TOC is the last tar entry, in a gzip member of its own, then the 51-byte footer. */
  private async writeGzipTrailer(json: Buffer): Promise<{ tocOffset: number }> {
    const tocOffset = this.written;
    const tar = Buffer.concat([ustarFileHeader(TOC_TAR_NAME, json.length), json, Buffer.alloc(paddingFor(json.length)), END_OF_ARCHIVE]);
    this.diffHash.update(tar);
    this.uncompressed += tar.length;
    // Readers fetch [tocOffset, footer) and gunzip it alone.
    await this.write(gzipSync(tar, { level: this.level }));
    await this.write(encodeFooter(tocOffset));
    return { tocOffset };
  }

  /**
   * zstd:chunked (as Go's zstdchunked.Compressor): the TOC JSON, zstd-compressed, in a skippable
   * frame, then the footer in another. Neither is part of the tar stream, which (like Go's) has
   * no end-of-archive blocks.
   */
  private async writeZstdTrailer(json: Buffer): Promise<{ tocOffset: number; zstdManifest: { checksum: string; position: string } }> {
    const compressed = zstdCompress(json, this.level);
    const tocOffset = this.written + SKIPPABLE_HEADER_SIZE;
    await this.write(skippableFrame(compressed));
    await this.write(skippableFrame(encodeZstdFooter(tocOffset, compressed.length, json.length)));
    const checksum = `sha256:${createHash('sha256').update(compressed).digest('hex')}`;
    return { tocOffset, zstdManifest: { checksum, position: `${tocOffset}:${compressed.length}:${json.length}:1` } };
  }

  private addBytes(bytes: Buffer): void {
    this.parts.push(bytes);
    this.partsLength += bytes.length;
    this.uncompressed += bytes.length;
    this.diffHash.update(bytes);
  }

  private async closeMember(): Promise<void> {
    if (this.chunkOpen) throw new Error('internal error: member closed inside a chunk');
    if (this.partsLength === 0) return;
    // A fresh ArrayBuffer per member, so it can be transferred to a worker without copying again.
    const data = new Uint8Array(this.partsLength);
    let at = 0;
    for (const part of this.parts) {
      data.set(part, at);
      at += part.length;
    }
    this.batch.push({ data, digestLength: this.chunkLength, onPlaced: this.onPlaced });
    this.batchBytes += data.length;
    this.parts = [];
    this.partsLength = 0;
    this.chunkLength = 0;
    this.onPlaced = undefined;
    if (this.batchBytes >= BATCH_BYTES || this.batch.length >= BATCH_MEMBERS) await this.submitBatch();
  }

  private async submitBatch(): Promise<void> {
    if (this.batch.length === 0) return;
    const members = this.batch;
    this.batch = [];
    this.batchBytes = 0;
    const results = this.pool.compress(members.map(({ data, digestLength }) => ({ data, digestLength })));
    results.catch(() => undefined); // observed in writeOldest; avoid an unhandled rejection meanwhile
    this.inFlight.push({ members, results });
    while (this.inFlight.length > this.maxInFlight) await this.writeOldest();
  }

  private async writeOldest(): Promise<void> {
    const batch = this.inFlight.shift();
    if (!batch) return;
    const compressed = await batch.results;
    for (const [i, member] of batch.members.entries()) {
      const result = itemAt(compressed, i); // the pool answers each member in order
      if (member.onPlaced) {
        if (result.digest === undefined) throw new Error('compression worker returned no digest for a chunk');
        member.onPlaced(this.written, result.digest);
      }
      await this.write(Buffer.from(result.compressed.buffer, result.compressed.byteOffset, result.compressed.byteLength));
    }
  }

  private async write(bytes: Buffer): Promise<void> {
    this.blobHash.update(bytes);
    this.written += bytes.length;
    if (!this.output.write(bytes)) await drained(this.output);
  }
}

/** Waits for 'drain', failing instead of hanging if the stream errors or closes first. */
async function drained(stream: Writable): Promise<void> {
  const controller = new AbortController();
  try {
    await Promise.race([
      once(stream, 'drain', { signal: controller.signal }),
      once(stream, 'close', { signal: controller.signal }).then(() => {
        throw new Error('output closed while writing');
      }),
      once(stream, 'error', { signal: controller.signal }).then(([error]) => {
        throw error;
      }),
    ]);
  } finally {
    controller.abort();
  }
}
