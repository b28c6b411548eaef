import { createHash, type Hash } from 'node:crypto';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';
import { itemAt } from '../common/indexing.js';
import { ByteReader } from './byte-reader.js';
import { EstargzError } from './errors.js';
import { gunzipCapped } from './gzip.js';
import { normalizeEntryName, shorten } from './names.js';
import { openEstargz, type OpenOptions } from './reader.js';
import { zstdTocLength, type Footer } from './footer.js';
import { zstdDecompressStream } from './zstd.js';
import { isSkippableHeader, SKIPPABLE_HEADER_SIZE, ZSTD_FOOTER_SIZE } from './zstd-footer.js';
import { readRangePieces, type RangeSource } from './source.js';
import {
  BLOCK,
  formatModtime,
  paddingFor,
  readTarEntry,
  TYPE_BLOCK,
  TYPE_CHAR,
  TYPE_DIR,
  TYPE_FIFO,
  TYPE_LINK,
  TYPE_REG,
  TYPE_SYMLINK,
  type TarHeader,
} from './tar.js';
import { DEFAULT_MAX_TOC_SIZE, TOC_TAR_NAME, type EstargzEntry } from './toc.js';

export interface VerifyResult {
  tocDigest: string;
  /** sha256 of the whole uncompressed stream. */
  diffID: string;
  uncompressedSize: number;
  entries: number;
  chunks: number;
}

const TYPE_NAMES: Record<string, string> = {
  [TYPE_REG]: 'reg',
  [TYPE_LINK]: 'hardlink',
  [TYPE_SYMLINK]: 'symlink',
  [TYPE_CHAR]: 'char',
  [TYPE_BLOCK]: 'block',
  [TYPE_DIR]: 'dir',
  [TYPE_FIFO]: 'fifo',
};

/**
 * Full check of a blob: the TOC (and its digest when given), then the whole blob decompressed
 * in order. The tar stream must match the TOC entry for entry (name, type, size, link, mode,
 * owner, device, mtime, xattrs); every chunk must hash to its chunkDigest and every file to its
 * digest; each chunk's TOC offset must be the start of a gzip member whose output begins exactly
 * at that chunk's bytes. The TOC member must hold the same JSON and end the archive (eStargz), or
 * sit in its skippable frame followed by the footer's (zstd:chunked).
 */
export async function verifyEstargz(source: RangeSource, options: OpenOptions = {}): Promise<VerifyResult> {
  const reader = await openEstargz(source, options);
  const payloadEnd = reader.payloadEnd;
  const zstd = reader.format === 'zstd';
  // Decompress the blob as independent segments cut at every data offset: a segment that does
  // not start at a member (frame) boundary fails to decompress. Record where each segment's output starts.
  const boundaries = [...new Set(reader.chunks.map((c) => c.offset))].sort((a, b) => a - b);
  if (boundaries[0] !== 0) boundaries.unshift(0);
  boundaries.push(payloadEnd);
  const segmentStart = new Map<number, number>();
  const diffHash = createHash('sha256');
  let produced = 0;
  async function* uncompressed(): AsyncGenerator<Buffer> {
    for (let i = 0; i + 1 < boundaries.length; i++) {
      const [start, end] = [itemAt(boundaries, i), itemAt(boundaries, i + 1)];
      segmentStart.set(start, produced);
      if (start === end) continue; // no content before the TOC
      const segment = zstd ? zstdRange(source, start, end) : gunzipRange(source, start, end);
      for await (const piece of segment) {
        diffHash.update(piece);
        produced += piece.length;
        yield piece;
      }
    }
    if (zstd) {
      await checkZstdTrailer(source, reader.footer);
      return; // the zstd:chunked TOC is not part of the tar stream
    }
    const tocMember = await source.read(reader.tocOffset, source.size - reader.footer.size - reader.tocOffset);
    const tocTar = gunzipCapped(tocMember, (options.maxTocSize ?? DEFAULT_MAX_TOC_SIZE) + 4 * BLOCK, 'TOC member');
    diffHash.update(tocTar);
    produced += tocTar.length;
    yield tocTar;
    // The footer must be a valid, empty gzip member so the blob is a well-formed tar.gz.
    const footer = gunzipCapped(await source.read(source.size - reader.footer.size, reader.footer.size), 1, 'footer');
    if (footer.length !== 0) throw new EstargzError('FOOTER', 'footer decompresses to data');
  }

  const tar = ByteReader.from(uncompressed());
  const tocEntries = reader.entries;
  let chunksChecked = 0;
  let index = 0;
  for (;;) {
    const entry = await readTarEntry(tar);
    if (!entry) break;
    const { header } = entry;
    if (header.name === TOC_TAR_NAME && !zstd) {
      await checkTocEntry(tar, header.size, reader.tocDigest);
      continue;
    }
    const expected = tocEntries[index++];
    const where = `tar entry "${shorten(header.name)}" at uncompressed offset ${entry.headerOffset}`;
    if (!expected) throw mismatch(`${where} is not in the TOC`);
    compareHeader(header, expected, where);
    if (expected.type === 'reg' && expected.size > 0) {
      chunksChecked += await checkFileData(tar, entry.dataOffset, expected, segmentStart, where);
    } else {
      await tar.skip(header.size, `data of ${where}`);
    }
    await tar.skip(paddingFor(header.size), 'padding');
  }
  const missing = tocEntries[index];
  if (missing) throw mismatch(`TOC entry "${shorten(missing.name)}" is missing from the tar stream`);
  await tar.drain();
  return {
    tocDigest: reader.tocDigest,
    diffID: `sha256:${diffHash.digest('hex')}`,
    uncompressedSize: produced,
    entries: tocEntries.length,
    chunks: chunksChecked,
  };
}

async function* gunzipRange(source: RangeSource, start: number, end: number): AsyncGenerator<Buffer> {
  const gunzip = createGunzip({ chunkSize: 1 << 20 });
  // pipeline (not pipe) so a failing read also fails the gunzip iteration instead of hanging it.
  const feeding = pipeline(Readable.from(readRangePieces(source, start, end - start)), gunzip);
  feeding.catch(() => undefined);
  try {
    for await (const piece of gunzip as AsyncIterable<Buffer>) yield piece;
    await feeding;
  } catch (error) {
    if (error instanceof EstargzError) throw error;
    throw new EstargzError(
      'GZIP',
      `blob bytes [${start}, ${end}) are not whole gzip members (a TOC offset does not start a member, or the data is corrupt): ${(error as Error).message}`,
      { cause: error },
    );
  } finally {
    gunzip.destroy();
  }
}

function zstdRange(source: RangeSource, start: number, end: number): AsyncGenerator<Buffer> {
  return zstdDecompressStream(
    readRangePieces(source, start, end - start),
    `blob bytes [${start}, ${end}) are not whole zstd frames (a TOC offset does not start a frame, or the data is corrupt)`,
  );
}

/** The two skippable frames after the data: the TOC's, then the footer's; nothing else. */
async function checkZstdTrailer(source: RangeSource, footer: Footer): Promise<void> {
  const tocHeader = await source.read(footer.payloadEnd, SKIPPABLE_HEADER_SIZE);
  const tocLength = zstdTocLength(footer);
  if (!isSkippableHeader(tocHeader, tocLength)) {
    throw new EstargzError('FOOTER', `no skippable frame of ${tocLength} bytes holds the TOC at offset ${footer.payloadEnd}`);
  }
  const footerFrame = footer.tocOffset + tocLength;
  if (footerFrame !== source.size - SKIPPABLE_HEADER_SIZE - ZSTD_FOOTER_SIZE) {
    throw new EstargzError(
      'FOOTER',
      `the footer frame should start right after the TOC at ${footerFrame}, but the blob is ${source.size} bytes`,
    );
  }
  if (!isSkippableHeader(await source.read(footerFrame, SKIPPABLE_HEADER_SIZE), ZSTD_FOOTER_SIZE)) {
    throw new EstargzError('FOOTER', 'the zstd:chunked footer is not in a 40-byte skippable frame');
  }
}

function compareHeader(header: TarHeader, toc: EstargzEntry, where: string): void {
  const differ = (field: string, tarValue: unknown, tocValue: unknown) => {
    if (tarValue !== tocValue)
      throw mismatch(`${where}: ${field} is ${JSON.stringify(tarValue)} in the tar but ${JSON.stringify(tocValue)} in the TOC`);
  };
  let name: string;
  try {
    name = normalizeEntryName(header.name);
  } catch (error) {
    throw mismatch(`${where}: ${(error as Error).message}`);
  }
  differ('name', name, toc.name);
  differ('type', TYPE_NAMES[header.typeflag] ?? `'${header.typeflag}'`, toc.type);
  differ('size', header.typeflag === TYPE_REG ? header.size : 0, toc.size);
  if (toc.type === 'symlink' || toc.type === 'hardlink') differ('link target', header.linkName, toc.linkName);
  differ('mode', header.mode, toc.mode);
  differ('uid', header.uid, toc.uid);
  differ('gid', header.gid, toc.gid);
  if (toc.type === 'char' || toc.type === 'block') {
    differ('device major', header.devMajor, toc.devMajor);
    differ('device minor', header.devMinor, toc.devMinor);
  }
  differ('modtime', formatModtime(header.mtime), toc.modtime);
  const tarXattrs = Object.keys(header.xattrs).sort();
  const tocXattrs = Object.keys(toc.xattrs).sort();
  differ('xattr names', tarXattrs.join(','), tocXattrs.join(','));
  for (const key of tarXattrs) {
    const [inTar, inToc] = [header.xattrs[key], toc.xattrs[key]]; // the same names, checked just above
    if (!inTar || !inToc || !inTar.equals(inToc)) throw mismatch(`${where}: xattr "${shorten(key)}" differs`);
  }
}

/** Streams a file's data, hashing each chunk and the whole file, checking chunk placement. */
async function checkFileData(
  tar: ByteReader,
  dataOffset: number,
  file: EstargzEntry,
  segmentStart: Map<number, number>,
  where: string,
): Promise<number> {
  const fileHash = createHash('sha256');
  for (const chunk of file.chunks) {
    const at = `${where}, chunk [${chunk.chunkOffset}, +${chunk.chunkSize})`;
    const chunkHash: Hash = createHash('sha256');
    for await (const piece of tar.readPieces(chunk.chunkSize, at)) {
      chunkHash.update(piece);
      fileHash.update(piece);
    }
    // The segment starting at chunk.offset must produce this chunk first. Checked after reading
    // the chunk: only then has the decompressor certainly reached that segment.
    const memberStart = segmentStart.get(chunk.offset);
    if (memberStart === undefined || memberStart + chunk.innerOffset !== dataOffset + chunk.chunkOffset) {
      throw mismatch(`${at}: TOC offset ${chunk.offset} does not point at this chunk's gzip member`);
    }
    const actual = `sha256:${chunkHash.digest('hex')}`;
    if (actual !== chunk.digest)
      throw new EstargzError('CHUNK_DIGEST', `${at}: content digest ${actual} does not match the TOC's ${chunk.digest}`);
  }
  const actual = `sha256:${fileHash.digest('hex')}`;
  if (file.digest && actual !== file.digest)
    throw new EstargzError('CHUNK_DIGEST', `${where}: file digest ${actual} does not match the TOC's ${file.digest}`);
  return file.chunks.length;
}

async function checkTocEntry(tar: ByteReader, size: number, tocDigest: string): Promise<void> {
  const hash = createHash('sha256');
  for await (const piece of tar.readPieces(size, 'the TOC JSON')) hash.update(piece);
  await tar.skip(paddingFor(size), 'padding');
  if (`sha256:${hash.digest('hex')}` !== tocDigest)
    throw mismatch('the TOC tar entry in the stream differs from the TOC read via the footer');
  if ((await readTarEntry(tar)) !== null) throw mismatch(`entries follow ${TOC_TAR_NAME}; it must be the last entry`);
}

function mismatch(message: string): EstargzError {
  return new EstargzError('MISMATCH', message);
}
