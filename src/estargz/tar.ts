import { ByteReader } from './byte-reader.js';
import { EstargzError } from './errors.js';
import { shorten } from './names.js';

export const BLOCK = 512;
/** PAX / GNU long-name payloads above this are refused rather than buffered. */
const MAX_EXTENSION_SIZE = 1024 * 1024;

/** A tar member's metadata after applying PAX and GNU long-name/link extensions. */
export interface TarHeader {
  name: string;
  linkName: string;
  /** The typeflag character; '\0' (old regular file) is normalized to '0' or '5' as Go's reader does. */
  typeflag: string;
  size: number;
  mode: number;
  uid: number;
  gid: number;
  uname: string;
  gname: string;
  /** Modification time: whole seconds (floored) and nanoseconds, as PAX allows fractions. */
  mtime: { seconds: number; nanos: number };
  devMajor: number;
  devMinor: number;
  /** SCHILY.xattr.* PAX records, values as raw bytes. */
  xattrs: Record<string, Buffer>;
}

export interface TarEntry {
  header: TarHeader;
  /** Every block that makes up the header: extension headers with their data, then the main header. */
  raw: Buffer;
  /** Offset of the first header block in the tar stream. */
  headerOffset: number;
  /** Offset of the data that follows the header. */
  dataOffset: number;
}

export const TYPE_REG = '0';
export const TYPE_LINK = '1';
export const TYPE_SYMLINK = '2';
export const TYPE_CHAR = '3';
export const TYPE_BLOCK = '4';
export const TYPE_DIR = '5';
export const TYPE_FIFO = '6';

export function paddingFor(size: number): number {
  return (BLOCK - (size % BLOCK)) % BLOCK;
}

/**
 * Reads the next member header (with any PAX/GNU extension headers before it). Returns null at
 * the end of the archive: two zero blocks, one zero block then EOF, or EOF at a block boundary,
 * the same cases Go's archive/tar accepts. The caller must consume `size` data bytes and their
 * padding before calling again.
 */
export async function readTarEntry(reader: ByteReader): Promise<TarEntry | null> {
  const headerOffset = reader.position;
  const rawBlocks: Buffer[] = [];
  let pax: Map<string, Buffer> | undefined;
  let gnuLongName: string | undefined;
  let gnuLongLink: string | undefined;

  for (;;) {
    const blockOffset = reader.position;
    const block = await reader.readExactOrEnd(BLOCK, 'a tar header');
    if (block === null) {
      if (rawBlocks.length > 0) throw tarError(blockOffset, 'archive ends after an extended header');
      return null;
    }
    if (isZeroBlock(block)) {
      if (rawBlocks.length > 0) throw tarError(blockOffset, 'zero block after an extended header');
      const second = await reader.readExactOrEnd(BLOCK, 'the end-of-archive marker');
      if (second === null || isZeroBlock(second)) return null;
      throw tarError(blockOffset, 'zero block followed by a non-zero block');
    }
    rawBlocks.push(Buffer.from(block)); // copy: the reader's buffer may be reused
    verifyChecksum(block, blockOffset);
    const typeflag = String.fromCharCode(block.readUInt8(156));
    const size = parseNumeric(block, 124, 12, 'size', blockOffset);

    if (typeflag === 'x' || typeflag === 'L' || typeflag === 'K') {
      if (size > MAX_EXTENSION_SIZE) throw tarError(blockOffset, `extended header of ${size} bytes is too large`);
      const data = Buffer.from(await reader.readExact(size, 'an extended header'));
      const padding = await reader.readExact(paddingFor(size), 'extended header padding');
      rawBlocks.push(data, Buffer.from(padding));
      if (typeflag === 'x') pax = mergeMaps(pax, parsePax(data, blockOffset));
      else if (typeflag === 'L') gnuLongName = cString(data);
      else gnuLongLink = cString(data);
      continue;
    }
    if (typeflag === 'g') throw new EstargzError('UNSUPPORTED', `tar offset ${blockOffset}: PAX global headers are not supported`);

    const header = parseHeaderBlock(block, blockOffset, size);
    if (pax) applyPax(header, pax, blockOffset);
    if (gnuLongName !== undefined) header.name = gnuLongName;
    if (gnuLongLink !== undefined) header.linkName = gnuLongLink;
    if (header.typeflag === '\0') header.typeflag = header.name.endsWith('/') ? TYPE_DIR : TYPE_REG;
    return { header, raw: Buffer.concat(rawBlocks), headerOffset, dataOffset: reader.position };
  }
}

/** Parses the header blocks of one member held in memory (as captured in TarEntry.raw). */
export async function parseRawHeader(raw: Buffer): Promise<TarHeader> {
  const reader = ByteReader.from(
    (async function* () {
      yield raw;
    })(),
  );
  const entry = await readTarEntry(reader);
  if (!entry || reader.position !== raw.length) throw new EstargzError('TAR', 'stored tar header is not a single member header');
  return entry.header;
}

function parseHeaderBlock(block: Buffer, offset: number, size: number): TarHeader {
  const magic = block.toString('latin1', 257, 265);
  const isUstar = magic === 'ustar\x0000';
  const isGnu = magic === 'ustar  \0';
  let name = cString(block.subarray(0, 100));
  if (isUstar) {
    // star stores a shorter prefix followed by atime/ctime and a "tar\0" trailer.
    const isStar = block.toString('latin1', 508, 512) === 'tar\0';
    const prefix = cString(block.subarray(345, isStar ? 345 + 131 : 500));
    if (prefix) name = `${prefix}/${name}`;
  }
  const hasOwnerNames = isUstar || isGnu;
  return {
    name,
    linkName: cString(block.subarray(157, 257)),
    typeflag: String.fromCharCode(block.readUInt8(156)),
    size,
    mode: parseNumeric(block, 100, 8, 'mode', offset),
    uid: parseNumeric(block, 108, 8, 'uid', offset),
    gid: parseNumeric(block, 116, 8, 'gid', offset),
    uname: hasOwnerNames ? cString(block.subarray(265, 297)) : '',
    gname: hasOwnerNames ? cString(block.subarray(297, 329)) : '',
    mtime: { seconds: parseNumeric(block, 136, 12, 'mtime', offset, true), nanos: 0 },
    devMajor: hasOwnerNames ? parseNumeric(block, 329, 8, 'devmajor', offset) : 0,
    devMinor: hasOwnerNames ? parseNumeric(block, 337, 8, 'devminor', offset) : 0,
    xattrs: {},
  };
}

function applyPax(header: TarHeader, pax: Map<string, Buffer>, offset: number): void {
  for (const [key, raw] of pax) {
    if (key.startsWith('SCHILY.xattr.')) {
      header.xattrs[key.slice('SCHILY.xattr.'.length)] = raw;
      continue;
    }
    if (key.startsWith('GNU.sparse.')) throw new EstargzError('UNSUPPORTED', `tar offset ${offset}: sparse files are not supported`);
    const value = raw.toString('utf8');
    if (value === '') continue; // an empty record keeps the header's own value (as in Go)
    switch (key) {
      case 'path':
        header.name = value;
        break;
      case 'linkpath':
        header.linkName = value;
        break;
      case 'uname':
        header.uname = value;
        break;
      case 'gname':
        header.gname = value;
        break;
      case 'uid':
      case 'gid':
      case 'size':
        header[key] = paxInteger(value, key, offset);
        break;
      case 'mtime':
        header.mtime = paxTime(value, offset);
        break;
    }
  }
}

/** PAX records: "<length> <key>=<value>\n", length counting the whole record. */
function parsePax(data: Buffer, offset: number): Map<string, Buffer> {
  const records = new Map<string, Buffer>();
  let pos = 0;
  while (pos < data.length) {
    const space = data.indexOf(0x20, pos);
    if (space < 0 || space - pos > 20) throw tarError(offset, 'malformed PAX record length');
    const lengthText = data.toString('latin1', pos, space);
    if (!/^[1-9][0-9]*$/.test(lengthText)) throw tarError(offset, `malformed PAX record length "${shorten(lengthText, 20)}"`);
    const length = Number(lengthText);
    const end = pos + length;
    if (end > data.length || data[end - 1] !== 0x0a) throw tarError(offset, 'PAX record runs past its header or lacks a newline');
    const record = data.subarray(space + 1, end - 1);
    const equals = record.indexOf(0x3d);
    if (equals <= 0) throw tarError(offset, 'PAX record without "key="');
    records.set(record.toString('utf8', 0, equals), Buffer.from(record.subarray(equals + 1)));
    pos = end;
  }
  return records;
}

function paxInteger(value: string, key: string, offset: number): number {
  if (!/^[0-9]{1,16}$/.test(value) || !Number.isSafeInteger(Number(value))) {
    throw tarError(offset, `PAX ${key} "${shorten(value, 30)}" is not a valid number`);
  }
  return Number(value);
}

/** PAX times are decimal seconds with an optional fraction and sign; keep nanosecond precision. */
function paxTime(value: string, offset: number): { seconds: number; nanos: number } {
  const match = /^(-?)([0-9]{1,15})(?:\.([0-9]*))?$/.exec(value);
  if (!match) throw tarError(offset, `PAX mtime "${shorten(value, 30)}" is not a valid time`);
  const whole = Number(match[2]);
  const nanos = Number((match[3] ?? '').slice(0, 9).padEnd(9, '0'));
  if (match[1] !== '-' || nanos === 0) return { seconds: match[1] ? -whole : whole, nanos };
  // -12.25 s is -13 s + 0.75 s.
  return { seconds: -whole - 1, nanos: 1e9 - nanos };
}

function mergeMaps(into: Map<string, Buffer> | undefined, from: Map<string, Buffer>): Map<string, Buffer> {
  if (!into) return from;
  for (const [key, value] of from) into.set(key, value);
  return into;
}

/** Tar numeric fields: octal text padded with spaces/NULs, or base-256 when the high bit is set. */
function parseNumeric(block: Buffer, start: number, length: number, what: string, offset: number, signed = false): number {
  const field = block.subarray(start, start + length);
  const first = field.readUInt8(0);
  if (first & 0x80) {
    const negative = (first & 0x40) !== 0;
    let value = BigInt(first & 0x7f);
    for (const byte of field.subarray(1)) value = (value << 8n) | BigInt(byte);
    if (negative) value -= 1n << BigInt(length * 8 - 1);
    if (value > BigInt(Number.MAX_SAFE_INTEGER) || value < -BigInt(Number.MAX_SAFE_INTEGER) || (value < 0n && !signed)) {
      throw tarError(offset, `${what} field is out of range`);
    }
    return Number(value);
  }
  const text = field.toString('latin1').replace(/^[ \0]+|[ \0]+$/g, '');
  if (text === '') return 0;
  if (!/^[0-7]+$/.test(text)) throw tarError(offset, `${what} field "${printable(text)}" is not octal`);
  return Number.parseInt(text, 8);
}

function verifyChecksum(block: Buffer, offset: number): void {
  const stored = parseNumeric(block, 148, 8, 'checksum', offset);
  let unsigned = 0;
  let signed = 0;
  for (let i = 0; i < BLOCK; i++) {
    const byte = i >= 148 && i < 156 ? 0x20 : block.readUInt8(i);
    unsigned += byte;
    signed += byte > 127 ? byte - 256 : byte;
  }
  // Some old writers summed signed chars; Go accepts either.
  if (stored !== unsigned && stored !== signed) throw tarError(offset, 'header checksum mismatch (not a tar stream, or corrupt)');
}

function isZeroBlock(block: Buffer): boolean {
  for (let i = 0; i < block.length; i++) if (block[i] !== 0) return false;
  return true;
}

function cString(bytes: Buffer): string {
  const nul = bytes.indexOf(0);
  return bytes.toString('utf8', 0, nul < 0 ? bytes.length : nul);
}

function printable(text: string): string {
  return shorten(text.replace(/[^\x20-\x7e]/g, '?'), 30);
}

function tarError(offset: number, message: string): EstargzError {
  return new EstargzError('TAR', `tar offset ${offset}: ${message}`);
}

/**
 * A minimal USTAR header for a regular file we create ourselves (landmarks, the TOC entry),
 * laid out as Go's archive/tar writes one: zero mode, ids and mtime, empty owner names.
 */
export function ustarFileHeader(name: string, size: number): Buffer {
  const block = Buffer.alloc(BLOCK);
  if (Buffer.byteLength(name) > 100) throw new RangeError(`name "${name}" does not fit a USTAR header`);
  block.write(name, 0, 'utf8');
  const octal = (value: number, start: number, length: number) =>
    block.write(`${value.toString(8).padStart(length - 1, '0')}\0`, start, 'latin1');
  octal(0, 100, 8); // mode
  octal(0, 108, 8); // uid
  octal(0, 116, 8); // gid
  octal(size, 124, 12);
  octal(0, 136, 12); // mtime
  block[156] = TYPE_REG.charCodeAt(0);
  block.write('ustar\x0000', 257, 'latin1');
  octal(0, 329, 8); // devmajor
  octal(0, 337, 8); // devminor
  block.fill(0x20, 148, 156);
  let sum = 0;
  for (const byte of block) sum += byte;
  block.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 'latin1');
  return block;
}

/** The 1024 zero bytes that end a tar archive. */
export const END_OF_ARCHIVE = Buffer.alloc(2 * BLOCK);

/** Go's formatModtime: empty for the zero/epoch time, else UTC RFC 3339 rounded to the second. */
export function formatModtime(mtime: { seconds: number; nanos: number }): string {
  if (mtime.seconds === 0) return '';
  const seconds = mtime.seconds + (mtime.nanos >= 500_000_000 ? 1 : 0);
  const date = new Date(seconds * 1000);
  if (Number.isNaN(date.getTime()) || date.getUTCFullYear() < 1 || date.getUTCFullYear() > 9999) {
    throw new EstargzError('TAR', `modification time ${mtime.seconds} is out of range`);
  }
  return date.toISOString().replace(/\.\d{3}Z$/, 'Z');
}
