import { parseDigest } from '../oci/digest.js';
import { EstargzError } from './errors.js';
import { goMarshalIndent, sortEntriesLikeGo, type GoJsonValue } from './go-json.js';
import { normalizeEntryName, shorten } from './names.js';

/** Name of the tar entry holding the TOC JSON, and of the landmark files. */
export const TOC_TAR_NAME = 'stargz.index.json';
export const PREFETCH_LANDMARK = '.prefetch.landmark';
export const NO_PREFETCH_LANDMARK = '.no.prefetch.landmark';
export const LANDMARK_CONTENTS = 0x0f;
/** Layer annotations carrying the TOC digest and the uncompressed size. */
export const TOC_DIGEST_ANNOTATION = 'containerd.io/snapshot/stargz/toc.digest';
export const UNCOMPRESSED_SIZE_ANNOTATION = 'io.containers.estargz.uncompressed-size';
/** Default cap on the uncompressed TOC JSON a reader accepts. */
export const DEFAULT_MAX_TOC_SIZE = 50 * 1024 * 1024;

export const ENTRY_TYPES = ['dir', 'reg', 'symlink', 'hardlink', 'char', 'block', 'fifo', 'chunk'] as const;
export type EntryType = (typeof ENTRY_TYPES)[number];

/** One TOC entry as it appears in stargz.index.json (Go's TOCEntry; absent means zero/empty). */
export interface TocEntry {
  name: string;
  type: EntryType;
  size?: number;
  modtime?: string;
  linkName?: string;
  mode?: number;
  uid?: number;
  gid?: number;
  userName?: string;
  groupName?: string;
  offset?: number;
  devMajor?: number;
  devMinor?: number;
  xattrs?: Record<string, Buffer>;
  digest?: string;
  chunkOffset?: number;
  chunkSize?: number;
  chunkDigest?: string;
  /** Newer writers (v0.13+) may pack several chunks into one gzip member; v0.12 never writes it. */
  innerOffset?: number;
}

export interface Toc {
  version: number;
  entries: TocEntry[];
}

/** Field order of Go's TOCEntry struct, which is the order its JSON encoder writes. */
const FIELD_ORDER = [
  'name',
  'type',
  'size',
  'modtime',
  'linkName',
  'mode',
  'uid',
  'gid',
  'userName',
  'groupName',
  'offset',
  'devMajor',
  'devMinor',
  'xattrs',
  'digest',
  'chunkOffset',
  'chunkSize',
  'chunkDigest',
  'innerOffset',
] as const;

/** The TOC JSON bytes exactly as Go's GzipCompressor writes them (MarshalIndent with a tab). */
export function serializeToc(toc: Toc): Buffer {
  const entries = toc.entries.map((entry) => {
    const out: { [key: string]: GoJsonValue } = {};
    for (const field of FIELD_ORDER) {
      const value = entry[field];
      // name and type are always written; everything else is `omitempty` in Go.
      if (field === 'name' || field === 'type') out[field] = value as string;
      else if (field === 'xattrs') {
        const xattrs = value as Record<string, Buffer> | undefined;
        if (!xattrs || Object.keys(xattrs).length === 0) continue;
        const encoded: { [key: string]: GoJsonValue } = {};
        for (const [key, bytes] of sortEntriesLikeGo(Object.entries(xattrs))) encoded[key] = bytes.toString('base64');
        out[field] = encoded;
      } else if (value !== undefined && value !== 0 && value !== '') out[field] = value as string | number;
    }
    return out;
  });
  return Buffer.from(goMarshalIndent({ version: toc.version, entries }), 'utf8');
}

/** Parses and type-checks TOC JSON; throws EstargzError naming the entry and field at fault. */
export function parseTocJson(json: Buffer): Toc {
  let value: unknown;
  try {
    value = JSON.parse(json.toString('utf8'));
  } catch (error) {
    throw new EstargzError('TOC', `TOC is not valid JSON: ${(error as Error).message}`);
  }
  if (!isObject(value)) throw new EstargzError('TOC', 'TOC JSON is not an object');
  if (value.version !== 1) throw new EstargzError('TOC', `unsupported TOC version ${JSON.stringify(value.version)}`);
  // Go writes `null` for a TOC without entries.
  const rawEntries = value.entries ?? [];
  if (!Array.isArray(rawEntries)) throw new EstargzError('TOC', 'TOC "entries" is not an array');
  return { version: 1, entries: rawEntries.map((raw, index) => checkEntry(raw, index)) };
}

const NUMBER_FIELDS = ['size', 'mode', 'uid', 'gid', 'offset', 'devMajor', 'devMinor', 'chunkOffset', 'chunkSize', 'innerOffset'] as const;
const STRING_FIELDS = ['modtime', 'linkName', 'userName', 'groupName', 'digest', 'chunkDigest'] as const;

function checkEntry(raw: unknown, index: number): TocEntry {
  const where = `TOC entry ${index}`;
  if (!isObject(raw)) throw new EstargzError('ENTRY', `${where} is not an object`);
  const type = raw.type;
  if (typeof type !== 'string' || !(ENTRY_TYPES as readonly string[]).includes(type)) {
    throw new EstargzError('ENTRY', `${where} has unknown type ${shorten(JSON.stringify(type) ?? 'undefined')}`);
  }
  const name = raw.name ?? '';
  if (typeof name !== 'string') throw new EstargzError('ENTRY', `${where}: "name" is not a string`);
  const entry: TocEntry = { name, type: type as EntryType };
  const at = `${where} ("${shorten(name)}")`;
  for (const field of NUMBER_FIELDS) {
    const v = raw[field];
    if (v === undefined || v === null) continue;
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) {
      throw new EstargzError('ENTRY', `${at}: "${field}" must be a non-negative integer, got ${shorten(JSON.stringify(v))}`);
    }
    entry[field] = v;
  }
  for (const field of STRING_FIELDS) {
    const v = raw[field];
    if (v === undefined || v === null) continue;
    if (typeof v !== 'string') throw new EstargzError('ENTRY', `${at}: "${field}" is not a string`);
    entry[field] = v;
  }
  for (const field of ['digest', 'chunkDigest'] as const) {
    const v = entry[field];
    if (v === undefined || v === '') continue;
    try {
      if (parseDigest(v).algorithm !== 'sha256') throw new Error('only sha256 is used by eStargz');
    } catch (error) {
      throw new EstargzError('ENTRY', `${at}: invalid "${field}": ${(error as Error).message}`);
    }
  }
  if (raw.xattrs !== undefined && raw.xattrs !== null) {
    if (!isObject(raw.xattrs)) throw new EstargzError('ENTRY', `${at}: "xattrs" is not an object`);
    entry.xattrs = {};
    for (const [key, v] of Object.entries(raw.xattrs)) {
      // Go encodes []byte as standard padded base64 and rejects anything else when decoding.
      if (typeof v !== 'string' || v.length % 4 !== 0 || !/^[A-Za-z0-9+/]*={0,2}$/.test(v)) {
        throw new EstargzError('ENTRY', `${at}: xattr "${shorten(key)}" is not base64`);
      }
      entry.xattrs[key] = Buffer.from(v, 'base64');
    }
  }
  return entry;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** A piece of a regular file stored as one gzip stream range of the blob. */
export interface ChunkRef {
  /** Normalized name of the file the chunk belongs to. */
  file: string;
  /** Compressed offset of the gzip member the chunk's bytes start in. */
  offset: number;
  /** Where the next member holding other data (or the TOC) starts: the range to fetch ends here. */
  end: number;
  /** Uncompressed bytes to skip from `offset` before the chunk starts (0 for v0.12 blobs). */
  innerOffset: number;
  /** Position and length of the chunk within the file. */
  chunkOffset: number;
  chunkSize: number;
  /** sha256 of the chunk's uncompressed bytes. */
  digest: string;
}

/** A file-system entry of an eStargz layer: a TOC entry other than "chunk", with its chunks. */
export interface EstargzEntry {
  /** Normalized path, relative to the root ("" is the root directory). */
  name: string;
  /** The name as stored in the TOC. */
  tocName: string;
  type: Exclude<EntryType, 'chunk'>;
  size: number;
  mode: number;
  uid: number;
  gid: number;
  userName: string;
  groupName: string;
  modtime: string;
  linkName: string;
  devMajor: number;
  devMinor: number;
  xattrs: Record<string, Buffer>;
  /** sha256 of the whole file (regular files). */
  digest: string;
  /** Chunks in file order; empty unless a regular file with data. */
  chunks: ChunkRef[];
}

export interface TocIndex {
  entries: EstargzEntry[];
  byName: Map<string, EstargzEntry>;
  /** Every chunk of every file, in TOC order. */
  chunks: ChunkRef[];
}

/**
 * Checks the TOC's structure against the blob layout and builds the lookup tables: names are
 * safe and unique, chunks follow their file contiguously and cover it exactly, data offsets lie
 * before the TOC and are unique, every chunk has a digest, hardlinks resolve.
 */
export function indexToc(toc: Toc, tocOffset: number): TocIndex {
  const entries: EstargzEntry[] = [];
  const byName = new Map<string, EstargzEntry>();
  const chunks: ChunkRef[] = [];
  const userNames = new Map<number, string>();
  const groupNames = new Map<number, string>();
  let file: EstargzEntry | undefined; // the regular file whose chunks may follow
  let covered = 0;
  const finishFile = () => {
    if (file && covered !== file.size) {
      throw new EstargzError('CHUNK', `file "${shorten(file.name)}": chunks cover ${covered} of ${file.size} bytes`);
    }
    file = undefined;
  };

  toc.entries.forEach((raw, index) => {
    const where = `TOC entry ${index} ("${shorten(raw.name)}")`;
    if (raw.type === 'chunk') {
      if (!file) throw new EstargzError('CHUNK', `${where}: "chunk" entry does not follow a regular file with data`);
      if (raw.name !== '' && normalizeEntryName(raw.name) !== file.name) {
        throw new EstargzError('CHUNK', `${where}: chunk names a different file than "${shorten(file.name)}"`);
      }
      covered = addChunk(file, raw, covered, tocOffset, where, chunks);
      return;
    }
    finishFile();
    const name = normalizeEntryName(raw.name);
    if (byName.has(name)) throw new EstargzError('DUPLICATE', `${where}: duplicate entry "${shorten(name)}"`);
    if (name === '' && raw.type !== 'dir') throw new EstargzError('ENTRY', `${where}: the root must be a directory`);
    // Writers record a user/group name only when it changes for an ID; later entries inherit it.
    const uid = raw.uid ?? 0;
    const gid = raw.gid ?? 0;
    if (raw.userName) userNames.set(uid, raw.userName);
    if (raw.groupName) groupNames.set(gid, raw.groupName);
    const entry: EstargzEntry = {
      name,
      tocName: raw.name,
      type: raw.type,
      size: raw.type === 'reg' ? (raw.size ?? 0) : 0,
      mode: raw.mode ?? 0,
      uid,
      gid,
      userName: raw.userName || userNames.get(uid) || '',
      groupName: raw.groupName || groupNames.get(gid) || '',
      modtime: raw.modtime ?? '',
      linkName: raw.linkName ?? '',
      devMajor: raw.devMajor ?? 0,
      devMinor: raw.devMinor ?? 0,
      xattrs: raw.xattrs ?? {},
      digest: raw.digest ?? '',
      chunks: [],
    };
    if ((raw.type === 'symlink' || raw.type === 'hardlink') && !entry.linkName) {
      throw new EstargzError('ENTRY', `${where}: ${raw.type} without "linkName"`);
    }
    entries.push(entry);
    byName.set(name, entry);
    if (entry.type === 'reg' && entry.size > 0) {
      if ((raw.chunkOffset ?? 0) !== 0) throw new EstargzError('CHUNK', `${where}: first chunk must start at 0`);
      file = entry;
      covered = addChunk(entry, raw, 0, tocOffset, where, chunks);
    }
  });
  finishFile();

  for (const entry of entries) if (entry.type === 'hardlink') resolveHardlink(entry, byName);
  assignChunkEnds(chunks, tocOffset);
  return { entries, byName, chunks };
}

function addChunk(file: EstargzEntry, raw: TocEntry, covered: number, tocOffset: number, where: string, chunks: ChunkRef[]): number {
  const chunkOffset = raw.chunkOffset ?? 0;
  if (chunkOffset !== covered) {
    throw new EstargzError('CHUNK', `${where}: chunk starts at ${chunkOffset}, expected ${covered} (chunks must be contiguous)`);
  }
  // A zero chunkSize means "up to the end of the file".
  const chunkSize = raw.chunkSize || file.size - chunkOffset;
  if (chunkSize <= 0 || chunkOffset + chunkSize > file.size) {
    throw new EstargzError('CHUNK', `${where}: chunk [${chunkOffset}, +${chunkSize}) exceeds file size ${file.size}`);
  }
  const offset = raw.offset ?? 0;
  if (offset >= tocOffset) {
    throw new EstargzError('CHUNK', `${where}: data offset ${offset} is not before the TOC at ${tocOffset}`);
  }
  // v0.12 TOCs may omit chunkDigest for unchunked files; the file digest then covers the chunk.
  const digest = raw.chunkDigest || (chunkSize === file.size ? raw.digest || file.digest : '');
  if (!digest) throw new EstargzError('CHUNK', `${where}: no chunkDigest, so the chunk cannot be verified`);
  const chunk: ChunkRef = { file: file.name, offset, end: 0, innerOffset: raw.innerOffset ?? 0, chunkOffset, chunkSize, digest };
  file.chunks.push(chunk);
  chunks.push(chunk);
  return chunkOffset + chunkSize;
}

/** Each chunk's fetch range ends at the next distinct data offset (or the TOC), like Go's NextOffset. */
function assignChunkEnds(chunks: ChunkRef[], tocOffset: number): void {
  const offsets = [...new Set(chunks.map((c) => c.offset))].sort((a, b) => a - b);
  const next = new Map<number, number>();
  offsets.forEach((offset, i) => next.set(offset, offsets[i + 1] ?? tocOffset));
  const seen = new Set<string>();
  for (const chunk of chunks) {
    const key = `${chunk.offset}+${chunk.innerOffset}`;
    if (seen.has(key)) {
      throw new EstargzError('CHUNK', `two chunks share data offset ${chunk.offset} (file "${shorten(chunk.file)}")`);
    }
    seen.add(key);
    chunk.end = next.get(chunk.offset) ?? tocOffset; // every chunk's offset is in the map
  }
}

/** Follows hardlinks to the entry holding the data; refuses dangling links and cycles. */
export function resolveHardlink(entry: EstargzEntry, byName: Map<string, EstargzEntry>): EstargzEntry {
  const visited = new Set<string>();
  let current = entry;
  while (current.type === 'hardlink') {
    if (visited.has(current.name)) throw new EstargzError('ENTRY', `hardlink cycle through "${shorten(current.name)}"`);
    visited.add(current.name);
    let targetName: string;
    try {
      targetName = normalizeEntryName(current.linkName);
    } catch (error) {
      throw new EstargzError('UNSAFE_NAME', `hardlink "${shorten(current.name)}": ${(error as Error).message}`);
    }
    const target = byName.get(targetName);
    if (!target) {
      throw new EstargzError('ENTRY', `hardlink "${shorten(current.name)}" points at missing "${shorten(current.linkName)}"`);
    }
    current = target;
  }
  return current;
}
