import { EstargzError } from './errors.js';
import { hasZstdFooterMagic, parseZstdFooter, ZSTD_FOOTER_SIZE } from './zstd-footer.js';

/**
 * The eStargz footer is an empty gzip member whose header carries an Extra field
 * `'S' 'G' <LE16 22> "%016x" STARGZ` holding the TOC offset: 10 header bytes + XLEN (2) +
 * 26 extra bytes + an empty stored deflate block (5) + CRC32/ISIZE (8) = 51 bytes.
 * The legacy stargz footer (47 bytes) has the 22-byte payload directly as the Extra field.
 */
export const FOOTER_SIZE = 51;
export const LEGACY_FOOTER_SIZE = 47;

const MAGIC = 'STARGZ';
const PAYLOAD_LENGTH = 16 + MAGIC.length; // 22
const GZIP_FLAG_EXTRA = 0x04;

export interface Footer {
  format: 'gzip' | 'zstd';
  tocOffset: number;
  /** Footer bytes at the end of the blob: 51 for eStargz, 47 for legacy stargz, 40 for zstd:chunked. */
  size: number;
  /** Where file data ends: the TOC offset for gzip, the TOC's skippable frame header for zstd. */
  payloadEnd: number;
  /** zstd:chunked only: compressed and raw TOC sizes from the footer. */
  tocLength?: number;
  tocRawLength?: number;
}

/** A zstd:chunked footer's compressed TOC length (gzip footers carry none). */
export function zstdTocLength(footer: Footer): number {
  if (footer.tocLength === undefined) throw footerError(`a ${footer.format} footer gives no TOC length`);
  return footer.tocLength;
}

/** The 51-byte footer pointing at the TOC member that starts at tocOffset. */
export function encodeFooter(tocOffset: number): Buffer {
  if (!Number.isSafeInteger(tocOffset) || tocOffset < 0) throw new RangeError(`invalid TOC offset ${tocOffset}`);
  const footer = Buffer.alloc(FOOTER_SIZE);
  // gzip header: magic, CM=deflate, FLG=FEXTRA, MTIME=0, XFL=0, OS=255 (unknown) as Go writes it.
  footer.set([0x1f, 0x8b, 0x08, GZIP_FLAG_EXTRA, 0, 0, 0, 0, 0, 0xff], 0);
  footer.writeUInt16LE(4 + PAYLOAD_LENGTH, 10);
  footer.write('SG', 12, 'latin1');
  footer.writeUInt16LE(PAYLOAD_LENGTH, 14);
  footer.write(tocOffset.toString(16).padStart(16, '0') + MAGIC, 16, 'latin1');
  // Final stored block of length 0 (LEN=0000, NLEN=ffff); CRC32 and ISIZE of nothing are zero.
  footer.set([0x01, 0x00, 0x00, 0xff, 0xff], 38);
  return footer;
}

/** Parses a 51-byte eStargz footer; throws an EstargzError naming what is wrong. */
export function parseFooter(bytes: Uint8Array): Footer {
  if (bytes.length !== FOOTER_SIZE) throw footerError(`footer must be ${FOOTER_SIZE} bytes, got ${bytes.length}`);
  const extra = gzipExtraField(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length));
  if (extra.length !== 4 + PAYLOAD_LENGTH) throw footerError(`gzip Extra field is ${extra.length} bytes, expected 26`);
  if (extra[0] !== 0x53 || extra[1] !== 0x47) throw footerError('gzip Extra subfield ID is not "SG"');
  const subfieldLength = extra.readUInt16LE(2);
  if (subfieldLength !== PAYLOAD_LENGTH) throw footerError(`"SG" subfield length is ${subfieldLength}, expected 22`);
  const tocOffset = parsePayload(extra.subarray(4));
  return { format: 'gzip', tocOffset, size: FOOTER_SIZE, payloadEnd: tocOffset };
}

/** Parses the 47-byte footer of legacy (pre-eStargz) stargz blobs. */
export function parseLegacyFooter(bytes: Uint8Array): Footer {
  if (bytes.length !== LEGACY_FOOTER_SIZE) {
    throw footerError(`legacy footer must be ${LEGACY_FOOTER_SIZE} bytes, got ${bytes.length}`);
  }
  const extra = gzipExtraField(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length));
  if (extra.length !== PAYLOAD_LENGTH) throw footerError(`legacy gzip Extra field is ${extra.length} bytes, expected 22`);
  const tocOffset = parsePayload(extra);
  return { format: 'gzip', tocOffset, size: LEGACY_FOOTER_SIZE, payloadEnd: tocOffset };
}

/** Tries the zstd:chunked footer, the eStargz footer, then the legacy one, on the tail of a blob (at least 51 bytes if available). */
export function parseAnyFooter(tail: Uint8Array): Footer {
  // zstd:chunked ends with its own magic; gzip footers end with a CRC and length of nothing.
  if (hasZstdFooterMagic(tail)) return parseZstdFooter(tail.subarray(tail.length - ZSTD_FOOTER_SIZE));
  const problems: string[] = [];
  for (const [size, parse] of [
    [FOOTER_SIZE, parseFooter],
    [LEGACY_FOOTER_SIZE, parseLegacyFooter],
  ] as const) {
    if (tail.length < size) {
      problems.push(`blob is smaller than a ${size}-byte footer`);
      continue;
    }
    try {
      return parse(tail.subarray(tail.length - size));
    } catch (error) {
      problems.push(error instanceof Error ? error.message : String(error));
    }
  }
  throw footerError(`no valid eStargz footer (${problems.join('; ')})`);
}

function gzipExtraField(footer: Buffer): Buffer {
  if (footer[0] !== 0x1f || footer[1] !== 0x8b) throw footerError('not a gzip member (bad magic)');
  if (footer[2] !== 0x08) throw footerError(`gzip compression method ${footer[2]} is not deflate`);
  // Any other header field (name, comment, header CRC) would not fit the fixed footer size.
  if (footer[3] !== GZIP_FLAG_EXTRA) throw footerError(`gzip flags 0x${footer.readUInt8(3).toString(16)} must be exactly FEXTRA`);
  const xlen = footer.readUInt16LE(10);
  if (12 + xlen > footer.length) throw footerError(`gzip Extra length ${xlen} runs past the footer`);
  return footer.subarray(12, 12 + xlen);
}

function parsePayload(payload: Buffer): number {
  const text = payload.toString('latin1');
  if (text.slice(16) !== MAGIC) throw footerError('STARGZ magic string missing from the footer');
  const hex = text.slice(0, 16);
  if (!/^[0-9a-fA-F]{16}$/.test(hex)) throw footerError(`TOC offset "${printable(hex)}" is not 16 hex digits`);
  const offset = Number.parseInt(hex, 16);
  if (!Number.isSafeInteger(offset)) throw footerError(`TOC offset 0x${hex} is too large`);
  return offset;
}

function printable(text: string): string {
  return text.replace(/[^\x20-\x7e]/g, '?');
}

function footerError(message: string): EstargzError {
  return new EstargzError('FOOTER', message);
}
