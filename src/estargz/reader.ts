import { createHash } from 'node:crypto';
import { itemAt } from '../common/indexing.js';
import { EstargzError, wrapError } from './errors.js';
import { parseAnyFooter, zstdTocLength, FOOTER_SIZE, type Footer } from './footer.js';
import { gunzipCapped, inflatePrefix } from './gzip.js';
import { zstdDecompressCapped, zstdDecompressPrefix } from './zstd.js';
import { SKIPPABLE_HEADER_SIZE } from './zstd-footer.js';
import { normalizeEntryName, shorten } from './names.js';
import type { RangeSource } from './source.js';
import { ByteReader } from './byte-reader.js';
import { BLOCK, readTarEntry } from './tar.js';
import {
  DEFAULT_MAX_TOC_SIZE,
  indexToc,
  parseTocJson,
  resolveHardlink,
  NO_PREFETCH_LANDMARK,
  PREFETCH_LANDMARK,
  TOC_TAR_NAME,
  type ChunkRef,
  type EstargzEntry,
  type Toc,
  type TocIndex,
} from './toc.js';

export interface OpenOptions {
  /** When given, the TOC JSON must hash to this digest (the layer's toc.digest annotation). */
  tocDigest?: string;
  /** Largest uncompressed TOC JSON accepted, in bytes (default 50 MiB). */
  maxTocSize?: number;
}

/**
 * Opens an eStargz blob through a RangeSource: reads the footer, then the TOC member, and
 * checks the TOC. Two reads in all; file contents are fetched later, chunk by chunk.
 */
export async function openEstargz(source: RangeSource, options: OpenOptions = {}): Promise<EstargzReader> {
  const maxTocSize = options.maxTocSize ?? DEFAULT_MAX_TOC_SIZE;
  // 51 bytes hold any footer: eStargz (51), legacy (47) or zstd:chunked (40).
  const tailLength = Math.min(source.size, FOOTER_SIZE);
  const tail = await readSource(source, source.size - tailLength, tailLength, 'footer');
  const footer = parseAnyFooter(tail);
  const json = footer.format === 'zstd' ? await readZstdToc(source, footer, maxTocSize) : await readGzipToc(source, footer, maxTocSize);
  const tocDigest = `sha256:${createHash('sha256').update(json).digest('hex')}`;
  if (options.tocDigest !== undefined && options.tocDigest !== tocDigest) {
    throw new EstargzError('TOC_DIGEST', `TOC digest mismatch: the blob's TOC is ${tocDigest}, expected ${options.tocDigest}`);
  }
  const toc = parseTocJson(json);
  return new EstargzReader(source, footer, toc, tocDigest, indexToc(toc, footer.payloadEnd));
}

/** eStargz: the TOC is a tar entry in its own gzip member, between the TOC offset and the footer. */
async function readGzipToc(source: RangeSource, footer: Footer, maxTocSize: number): Promise<Buffer> {
  const tocEnd = source.size - footer.size;
  if (footer.tocOffset >= tocEnd) {
    throw new EstargzError(
      'FOOTER',
      `TOC offset ${footer.tocOffset} is out of range (the TOC must start before byte ${tocEnd} of a ${source.size}-byte blob)`,
    );
  }
  // Compressed JSON is almost never larger than itself plus gzip/tar framing; refuse absurd sizes
  // before fetching them.
  const compressedLength = tocEnd - footer.tocOffset;
  if (compressedLength > maxTocSize + 64 * 1024) {
    throw new EstargzError('TOC_TOO_LARGE', `compressed TOC is ${compressedLength} bytes, over the ${maxTocSize}-byte limit`);
  }
  const compressed = await readSource(source, footer.tocOffset, compressedLength, 'TOC');
  // The member holds a tar header, the JSON, padding and the end-of-archive marker.
  const tocTar = gunzipCapped(compressed, maxTocSize + 4 * BLOCK, `TOC member (limit: ${maxTocSize} bytes of JSON)`);
  return extractTocJson(tocTar, maxTocSize);
}

/** zstd:chunked: the footer gives the compressed TOC's place and size; the TOC is bare JSON. */
async function readZstdToc(source: RangeSource, footer: Footer, maxTocSize: number): Promise<Buffer> {
  const length = zstdTocLength(footer);
  const trailerStart = source.size - footer.size - SKIPPABLE_HEADER_SIZE;
  if (footer.tocOffset + length > trailerStart) {
    throw new EstargzError(
      'FOOTER',
      `TOC [${footer.tocOffset}, +${length}) runs past the footer frame at ${trailerStart} of a ${source.size}-byte blob`,
    );
  }
  if (length > maxTocSize + 64 * 1024 || (footer.tocRawLength ?? 0) > maxTocSize) {
    throw new EstargzError(
      'TOC_TOO_LARGE',
      `TOC is ${footer.tocRawLength} bytes (${length} compressed), over the ${maxTocSize}-byte limit`,
    );
  }
  const compressed = await readSource(source, footer.tocOffset, length, 'TOC');
  return zstdDecompressCapped(compressed, maxTocSize, `zstd TOC (limit: ${maxTocSize} bytes)`);
}

async function extractTocJson(tar: Buffer, maxTocSize: number): Promise<Buffer> {
  const reader = ByteReader.from(
    (async function* () {
      yield tar;
    })(),
  );
  const entry = await readTarEntry(reader).catch((error: unknown) => {
    throw wrapError('TOC', 'TOC member is not a tar stream', error);
  });
  if (!entry) throw new EstargzError('TOC', 'TOC member holds no tar entry');
  if (entry.header.name !== TOC_TAR_NAME) {
    throw new EstargzError('TOC', `TOC tar entry is named "${shorten(entry.header.name)}", expected "${TOC_TAR_NAME}"`);
  }
  if (entry.header.size > maxTocSize) {
    throw new EstargzError('TOC_TOO_LARGE', `TOC JSON is ${entry.header.size} bytes, over the ${maxTocSize}-byte limit`);
  }
  return reader.readExact(entry.header.size, 'the TOC JSON');
}

async function readSource(source: RangeSource, offset: number, length: number, what: string): Promise<Buffer> {
  let bytes: Buffer;
  try {
    bytes = await source.read(offset, length);
  } catch (error) {
    throw wrapError('INPUT', `reading ${what} at [${offset}, +${length})`, error);
  }
  if (bytes.length !== length) throw new EstargzError('INPUT', `reading ${what}: got ${bytes.length} of ${length} bytes`);
  return bytes;
}

/** Random access to the files of an opened eStargz blob; every chunk read is verified. */
export class EstargzReader {
  constructor(
    readonly source: RangeSource,
    readonly footer: Footer,
    /** The parsed TOC, as stored. */
    readonly toc: Toc,
    /** sha256 of the TOC JSON as stored in the blob. */
    readonly tocDigest: string,
    private readonly index: TocIndex,
  ) {}

  get tocOffset(): number {
    return this.footer.tocOffset;
  }

  /** 'gzip' (eStargz) or 'zstd' (zstd:chunked). */
  get format(): 'gzip' | 'zstd' {
    return this.footer.format;
  }

  /** Where file data ends (the TOC's gzip member, or the zstd TOC's skippable frame). */
  get payloadEnd(): number {
    return this.footer.payloadEnd;
  }

  /** File-system entries in TOC order (chunk entries are folded into their file). */
  get entries(): readonly EstargzEntry[] {
    return this.index.entries;
  }

  /** Every chunk in TOC order. */
  get chunks(): readonly ChunkRef[] {
    return this.index.chunks;
  }

  /** The entry for a path ("a/b", "/a/b" and "./a/b" are the same); hardlinks are not followed. */
  lookup(path: string): EstargzEntry | undefined {
    return this.index.byName.get(normalizeEntryName(path.replace(/^\/+/, '')));
  }

  /** Range of the blob to prefetch (everything before the .prefetch.landmark), if the layer has one. */
  prefetchRange(): { offset: number; length: number } | undefined {
    if (this.index.byName.has(NO_PREFETCH_LANDMARK)) return undefined;
    const landmark = this.index.byName.get(PREFETCH_LANDMARK);
    const offset = landmark?.chunks[0]?.offset;
    return offset === undefined ? undefined : { offset: 0, length: offset };
  }

  /** The whole content of a regular file (following hardlinks). */
  async readFile(path: string): Promise<Buffer> {
    const file = this.regularFile(path);
    return this.readRange(path, 0, file.size);
  }

  /** Up to `length` bytes from `offset` in a file; fetches and verifies only the chunks needed. */
  async readRange(path: string, offset: number, length: number): Promise<Buffer> {
    const file = this.regularFile(path);
    if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0) {
      throw new EstargzError('INPUT', `invalid range [${offset}, +${length})`);
    }
    const end = Math.min(file.size, offset + length);
    if (offset >= end) return Buffer.alloc(0);
    const needed = file.chunks.filter((c) => c.chunkOffset < end && c.chunkOffset + c.chunkSize > offset);
    const parts = await Promise.all(needed.map((c) => this.readChunk(c)));
    const out = Buffer.concat(parts);
    const start = offset - itemAt(needed, 0).chunkOffset; // offset < end: some chunk holds it
    return out.subarray(start, start + (end - offset));
  }

  /** A file's content chunk by chunk (bounded memory, for streaming out large files). */
  async *fileChunks(path: string): AsyncGenerator<Buffer> {
    for (const chunk of this.regularFile(path).chunks) yield await this.readChunk(chunk);
  }

  /** Fetches one chunk's compressed range, decompresses just the chunk, and checks its digest. */
  async readChunk(chunk: ChunkRef): Promise<Buffer> {
    const where = `chunk [${chunk.chunkOffset}, +${chunk.chunkSize}) of "${shorten(chunk.file)}" at blob offset ${chunk.offset}`;
    const compressed = await readSource(this.source, chunk.offset, chunk.end - chunk.offset, where);
    const want = chunk.innerOffset + chunk.chunkSize;
    const plain =
      this.footer.format === 'zstd' ? zstdDecompressPrefix(compressed, want, where) : await inflatePrefix(compressed, want, where);
    if (plain.length < want) {
      throw new EstargzError('CHUNK', `${where}: gzip data ends after ${plain.length} of ${want} bytes`);
    }
    const data = plain.subarray(chunk.innerOffset, want);
    const actual = `sha256:${createHash('sha256').update(data).digest('hex')}`;
    if (actual !== chunk.digest) {
      throw new EstargzError('CHUNK_DIGEST', `${where}: content digest ${actual} does not match the TOC's ${chunk.digest}`);
    }
    return data;
  }

  private regularFile(path: string): EstargzEntry {
    const entry = this.lookup(path);
    if (!entry) throw new EstargzError('NOT_FOUND', `"${shorten(path)}" is not in the layer`);
    const target = resolveHardlink(entry, this.index.byName);
    if (target.type !== 'reg') throw new EstargzError('NOT_FOUND', `"${shorten(path)}" is a ${target.type}, not a regular file`);
    return target;
  }
}
