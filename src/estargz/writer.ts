import { createHash } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { finished } from 'node:stream/promises';
import { BlobAssembler } from './assembler.js';
import { CompressionPool } from './compress-pool.js';
import { landmarkEntry, orderSpooled, spoolTar, spooledEntry, streamedEntries, type LayerEntry } from './entries.js';
import { EstargzError, wrapError } from './errors.js';
import { plainTarStream } from './input.js';
import { shorten } from './names.js';
import { fileSource } from './source.js';
import { DEFAULT_ZSTD_LEVEL, MAX_ZSTD_LEVEL } from './zstd.js';
import {
  formatModtime,
  paddingFor,
  TYPE_BLOCK,
  TYPE_CHAR,
  TYPE_DIR,
  TYPE_FIFO,
  TYPE_LINK,
  TYPE_REG,
  TYPE_SYMLINK,
  type TarHeader,
} from './tar.js';
import { serializeToc, type EntryType, type Toc, type TocEntry } from './toc.js';

export const DEFAULT_CHUNK_SIZE = 4 << 20;
/** Go's estargz.Build defaults to gzip.BestCompression. */
export const DEFAULT_LEVEL = 9;

export interface BuildOptions {
  /** Largest piece of a file stored as one gzip member (Go's default: 4 MiB). */
  chunkSize?: number;
  /** 'gzip' makes eStargz; 'zstd' makes zstd:chunked (each chunk its own zstd frame). */
  compression?: 'gzip' | 'zstd';
  /** gzip level 0-9 (default 9, like Go's Build), or zstd level 1-19 (default 3, Go's SpeedDefault). */
  level?: number;
  /** Paths to place first, followed by `.prefetch.landmark`; implies spooling. */
  prioritizedFiles?: string[];
  /**
   * When given, prioritized paths missing from the layer are appended here instead of failing
   * (Go's WithAllowPrioritizeNotFound): an image-wide list meets each layer.
   */
  missingPrioritized?: string[];
  /** Compression threads (default: available cores). Does not change the output. */
  workers?: number;
  /**
   * Copy the tar to a temporary file first. Needed to reorder (prioritized files) and to keep
   * only the last of duplicate names as Go does; without it the input is converted in one pass.
   */
  spool?: boolean;
  /** Directory for the spool file (default: the OS temp dir). */
  tmpDir?: string;
}

export interface BuildResult {
  /** sha256 of the uncompressed TOC JSON (the `containerd.io/snapshot/stargz/toc.digest` annotation). */
  tocDigest: string;
  /** sha256 of the uncompressed tar stream. */
  diffID: string;
  /** sha256 of the blob. */
  digest: string;
  size: number;
  uncompressedSize: number;
  /** zstd:chunked only: the io.containers.zstd-chunked.manifest-{checksum,position} annotation values. */
  zstdManifest?: { checksum: string; position: string };
}

const TYPES: Record<string, EntryType> = {
  [TYPE_REG]: 'reg',
  [TYPE_LINK]: 'hardlink',
  [TYPE_SYMLINK]: 'symlink',
  [TYPE_CHAR]: 'char',
  [TYPE_BLOCK]: 'block',
  [TYPE_DIR]: 'dir',
  [TYPE_FIFO]: 'fifo',
};
const EMPTY_DIGEST = `sha256:${createHash('sha256').digest('hex')}`;

/**
 * Converts a tar, tar.gz or tar.zst layer into an eStargz (or zstd:chunked) blob written to
 * `output` (which is ended).
 * The output is the same for the same input and chunkSize/level, whatever the worker count.
 */
export async function buildEstargz(input: Readable, output: Writable, options: BuildOptions = {}): Promise<BuildResult> {
  const chunkSize = options.chunkSize ?? DEFAULT_CHUNK_SIZE;
  const format = options.compression ?? 'gzip';
  const level = options.level ?? (format === 'zstd' ? DEFAULT_ZSTD_LEVEL : DEFAULT_LEVEL);
  const prioritized = options.prioritizedFiles ?? [];
  if (!Number.isSafeInteger(chunkSize) || chunkSize < 1) throw new EstargzError('INPUT', `invalid chunk size ${chunkSize}`);
  const [minLevel, maxLevel] = format === 'zstd' ? [1, MAX_ZSTD_LEVEL] : [0, 9];
  if (!Number.isInteger(level) || level < minLevel || level > maxLevel) {
    throw new EstargzError('INPUT', `invalid ${format} level ${level} (${minLevel}-${maxLevel})`);
  }
  const spool = options.spool ?? prioritized.length > 0;
  if (prioritized.length > 0 && !spool) throw new EstargzError('INPUT', 'prioritized files need spooling');

  const pool = new CompressionPool(level, options.workers, format);
  const assembler = new BlobAssembler(output, pool, format, level, Math.max(chunkSize, 64 * 1024));
  const encoder = new TocEncoder(assembler, chunkSize);
  let spoolDir: string | undefined;
  try {
    const tar = plainTarStream(input);
    if (!spool) {
      for await (const entry of streamedEntries(tar)) await encoder.add(entry);
    } else {
      spoolDir = await mkdtemp(join(options.tmpDir ?? tmpdir(), 'starling-estargz-'));
      const spoolPath = join(spoolDir, 'layer.tar');
      const { front, rest } = orderSpooled(await spoolTar(tar, spoolPath), prioritized, options.missingPrioritized);
      const file = await fileSource(spoolPath);
      try {
        for (const record of front) await encoder.add(await spooledEntry(file, record));
        await encoder.add(landmarkEntry(prioritized.length > 0));
        for (const record of rest) await encoder.add(await spooledEntry(file, record));
      } finally {
        await file.close();
      }
    }
    const result = await assembler.finish(() => encoder.tocJson());
    output.end();
    await finished(output);
    if (!encoder.tocDigest) throw new Error('the assembler finished without writing the TOC');
    return {
      tocDigest: encoder.tocDigest,
      diffID: result.diffID,
      digest: result.digest,
      size: result.size,
      uncompressedSize: result.uncompressedSize,
      ...(result.zstdManifest ? { zstdManifest: result.zstdManifest } : {}),
    };
  } catch (error) {
    // Destroy without an error argument: an 'error' event nobody listens to would crash the
    // process; the rejected promise is how the failure is reported.
    output.destroy();
    throw wrapError('INPUT', 'building eStargz failed', error);
  } finally {
    await pool.close();
    if (spoolDir) await rm(spoolDir, { recursive: true, force: true });
  }
}

/** Turns tar members into TOC entries (as Go's Writer.AppendTar does) and feeds the assembler. */
class TocEncoder {
  private readonly entries: TocEntry[] = [];
  private readonly lastUserName = new Map<number, string>();
  private readonly lastGroupName = new Map<number, string>();
  tocDigest: string | undefined;

  constructor(
    private readonly assembler: BlobAssembler,
    private readonly chunkSize: number,
  ) {}

  async add({ header, raw, data }: LayerEntry): Promise<void> {
    const type = TYPES[header.typeflag];
    if (!type) {
      throw new EstargzError('UNSUPPORTED', `unsupported tar entry type '${printableFlag(header.typeflag)}' for "${shorten(header.name)}"`);
    }
    if (type !== 'reg' && header.size !== 0) {
      throw new EstargzError('TAR', `"${shorten(header.name)}" is a ${type} but its tar header declares ${header.size} data bytes`);
    }
    const entry: TocEntry = {
      name: header.name,
      type,
      modtime: formatModtime(header.mtime),
      mode: header.mode,
      uid: header.uid,
      gid: header.gid,
      // Like Go: a name is written only when it differs from the last one written for that id.
      userName: nameIfChanged(this.lastUserName, header.uid, header.uname),
      groupName: nameIfChanged(this.lastGroupName, header.gid, header.gname),
      xattrs: header.xattrs,
    };
    if (type === 'hardlink' || type === 'symlink') entry.linkName = header.linkName;
    if (type === 'char' || type === 'block') {
      entry.devMajor = header.devMajor;
      entry.devMinor = header.devMinor;
    }
    await this.assembler.appendRaw(raw);
    if (type !== 'reg') {
      this.entries.push(entry);
      return;
    }
    entry.size = header.size;
    if (header.size === 0) {
      entry.digest = EMPTY_DIGEST;
      this.entries.push(entry);
    } else {
      await this.addFileData(header, entry, data);
    }
    await this.assembler.appendRaw(Buffer.alloc(paddingFor(header.size)));
  }

  /** Splits the payload into chunks; each chunk starts a gzip member and gets a TOC entry. */
  private async addFileData(header: TarHeader, file: TocEntry, data: AsyncIterable<Buffer> | Iterable<Buffer>): Promise<void> {
    const size = header.size;
    const singleChunk = size <= this.chunkSize;
    // One chunk: its digest (hashed by the worker) is the file digest. Else hash the file here.
    const fileHash = singleChunk ? undefined : createHash('sha256');
    let written = 0;
    let chunkEnd = 0;
    let chunk: TocEntry | undefined;
    for await (let piece of data) {
      while (piece.length > 0) {
        if (!chunk) {
          chunk = written === 0 ? file : { name: header.name, type: 'chunk' };
          chunk.chunkOffset = written;
          const remain = size - written;
          // Go records chunkSize except on a last chunk shorter than the chunk size.
          if (remain >= this.chunkSize) chunk.chunkSize = this.chunkSize;
          chunkEnd = written + Math.min(remain, this.chunkSize);
          const target = chunk;
          await this.assembler.startChunk((offset, digest) => {
            target.offset = offset;
            target.chunkDigest = digest;
            if (singleChunk) file.digest = digest;
          });
          this.entries.push(chunk);
        }
        const take = Math.min(piece.length, chunkEnd - written);
        const part = piece.subarray(0, take);
        this.assembler.appendChunkData(part);
        fileHash?.update(part);
        written += take;
        piece = piece.subarray(take);
        if (written === chunkEnd) {
          this.assembler.endChunk();
          chunk = undefined;
        }
        if (written === size && piece.length > 0) throw new EstargzError('INPUT', `too much data for "${shorten(header.name)}"`);
      }
    }
    if (written !== size) {
      throw new EstargzError('TAR', `tar stream ends inside "${shorten(header.name)}" (${written} of ${size} bytes)`);
    }
    if (fileHash) file.digest = `sha256:${fileHash.digest('hex')}`;
  }

  /** The TOC JSON; records the TOC digest. */
  tocJson(): Buffer {
    const toc: Toc = { version: 1, entries: this.entries };
    const json = serializeToc(toc);
    this.tocDigest = `sha256:${createHash('sha256').update(json).digest('hex')}`;
    return json;
  }
}

function nameIfChanged(last: Map<number, string>, id: number, name: string): string {
  if (name === '' || last.get(id) === name) return '';
  last.set(id, name);
  return name;
}

function printableFlag(flag: string): string {
  const code = flag.charCodeAt(0);
  return code >= 0x20 && code < 0x7f ? flag : `\\x${code.toString(16).padStart(2, '0')}`;
}
