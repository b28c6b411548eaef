import { EstargzError } from './errors.js';
import type { Footer } from './footer.js';

/*
 * zstd:chunked (stargz-snapshotter v0.12 estargz/zstdchunked): after the data frames come two
 * zstd skippable frames (magic 0x184D2A50, LE32 length, payload): the zstd-compressed TOC JSON,
 * then a 40-byte footer: LE64 offset of the compressed TOC (just past its frame header),
 * LE64 compressed TOC size, LE64 raw TOC size, LE64 manifest type (1 = CRFS), "GnUlInUx".
 */
export const ZSTD_FOOTER_SIZE = 40;
/** Magic and LE32 length at the start of a skippable frame. */
export const SKIPPABLE_HEADER_SIZE = 8;
const SKIPPABLE_MAGIC = Buffer.from([0x50, 0x2a, 0x4d, 0x18]);
const FOOTER_MAGIC = Buffer.from('GnUlInUx', 'latin1');
const MANIFEST_TYPE_CRFS = 1;
/** Layer annotations the Go converter sets on zstd:chunked layers. */
export const ZSTD_MANIFEST_CHECKSUM_ANNOTATION = 'io.containers.zstd-chunked.manifest-checksum';
export const ZSTD_MANIFEST_POSITION_ANNOTATION = 'io.containers.zstd-chunked.manifest-position';

export function skippableFrame(payload: Buffer): Buffer {
  const header = Buffer.alloc(SKIPPABLE_HEADER_SIZE);
  SKIPPABLE_MAGIC.copy(header);
  header.writeUInt32LE(payload.length, 4);
  return Buffer.concat([header, payload]);
}

export function isSkippableHeader(bytes: Buffer, payloadLength: number): boolean {
  return bytes.length === SKIPPABLE_HEADER_SIZE && bytes.subarray(0, 4).equals(SKIPPABLE_MAGIC) && bytes.readUInt32LE(4) === payloadLength;
}

export function encodeZstdFooter(tocOffset: number, compressedLength: number, rawLength: number): Buffer {
  const footer = Buffer.alloc(ZSTD_FOOTER_SIZE);
  footer.writeBigUInt64LE(BigInt(tocOffset), 0);
  footer.writeBigUInt64LE(BigInt(compressedLength), 8);
  footer.writeBigUInt64LE(BigInt(rawLength), 16);
  footer.writeBigUInt64LE(BigInt(MANIFEST_TYPE_CRFS), 24);
  FOOTER_MAGIC.copy(footer, 32);
  return footer;
}

export function hasZstdFooterMagic(tail: Uint8Array): boolean {
  return tail.length >= ZSTD_FOOTER_SIZE && Buffer.from(tail.subarray(tail.length - 8)).equals(FOOTER_MAGIC);
}

/** Parses the 40-byte zstd:chunked footer (the last 40 bytes of the blob). */
export function parseZstdFooter(bytes: Uint8Array): Footer {
  if (bytes.length !== ZSTD_FOOTER_SIZE) throw footerError(`zstd:chunked footer must be ${ZSTD_FOOTER_SIZE} bytes, got ${bytes.length}`);
  const footer = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length);
  if (!footer.subarray(32).equals(FOOTER_MAGIC)) throw footerError('zstd:chunked footer lacks the "GnUlInUx" magic');
  const field = (at: number, name: string): number => {
    const value = footer.readBigUInt64LE(at);
    if (value > BigInt(Number.MAX_SAFE_INTEGER)) throw footerError(`zstd:chunked footer: ${name} ${value} is too large`);
    return Number(value);
  };
  const tocOffset = field(0, 'TOC offset');
  const tocLength = field(8, 'compressed TOC size');
  const tocRawLength = field(16, 'raw TOC size');
  const type = field(24, 'manifest type');
  if (type !== MANIFEST_TYPE_CRFS) throw footerError(`zstd:chunked manifest type ${type} is not supported (only 1, CRFS)`);
  if (tocOffset < SKIPPABLE_HEADER_SIZE) throw footerError(`zstd:chunked TOC offset ${tocOffset} leaves no room for its frame header`);
  return { format: 'zstd', tocOffset, tocLength, tocRawLength, size: ZSTD_FOOTER_SIZE, payloadEnd: tocOffset - SKIPPABLE_HEADER_SIZE };
}

function footerError(message: string): EstargzError {
  return new EstargzError('FOOTER', message);
}
