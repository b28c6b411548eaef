import { constants as fsConstants } from 'node:fs';
import { mkdir, open, readFile, rename, rm, utimes, writeFile, stat, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { checkMatches, checkSha256, isPieceCheck, type PieceCheck } from './piece-check.js';
import { pieceBounds, pieceLayout, type PieceLayout } from './piece-plan.js';

/**
 * A registry that holds the blob: the one it was first fetched for, and any that delivered a
 * verified copy since. Who may be served a cached blob is decided from these (docs/security.md).
 */
export interface BlobSource {
  /** The registry's origin, scheme://host[:port]. */
  registry: string;
  /** The repository it was read from there. */
  repository: string;
  /** The registry served the blob to an anonymous request, so anyone may be given it. */
  public: boolean;
}

/** What is persisted about a blob besides its bytes. */
export interface BlobMeta {
  version: 1;
  digest: string;
  size: number;
  pieceSize: number;
  /** Where the blob comes from, the registry it is being fetched for first. */
  sources: BlobSource[];
  /** The whole blob was verified against its digest and flushed to disk. */
  complete: boolean;
  createdAt: string;
}

const META = 'meta.json';
const DATA = 'data';
/** Append-only journal of stored pieces: one "index check" line per piece (piece-check.ts), written after its bytes. */
const JOURNAL = 'pieces';

/**
 * One blob on disk: a sparse data file holding pieces at their offsets, a piece journal and the
 * metadata. A piece counts as stored only once its bytes are written and its journal line follows;
 * after a crash, journaled pieces of an incomplete blob are hashed again and dropped if torn.
 */
export class StoredBlob {
  readonly layout: PieceLayout;
  private readonly pieces = new Map<number, string>();
  private bytesStored = 0;
  lastAccess: number;

  private constructor(
    readonly dir: string,
    private meta: BlobMeta,
    private readonly data: FileHandle,
    private readonly journal: FileHandle,
    lastAccess: number,
  ) {
    this.layout = pieceLayout(meta.size, meta.pieceSize);
    this.lastAccess = lastAccess;
  }

  static async create(dir: string, init: Omit<BlobMeta, 'version' | 'complete' | 'createdAt'>): Promise<StoredBlob> {
    await rm(dir, { recursive: true, force: true });
    await mkdir(dir, { recursive: true });
    const meta: BlobMeta = { version: 1, complete: false, createdAt: new Date().toISOString(), ...init };
    const data = await open(join(dir, DATA), 'w+');
    await data.truncate(meta.size);
    const journal = await open(join(dir, JOURNAL), fsConstants.O_CREAT | fsConstants.O_WRONLY | fsConstants.O_APPEND);
    await writeMetaAtomically(dir, meta);
    return new StoredBlob(dir, meta, data, journal, Date.now());
  }

  /** Loads a blob left by an earlier run; returns the number of journaled pieces found torn. */
  static async load(dir: string): Promise<{ blob: StoredBlob; droppedPieces: number }> {
    const meta = parseMeta(await readFile(join(dir, META), 'utf8'), dir);
    const data = await open(join(dir, DATA), 'r+');
    const dataSize = (await data.stat()).size;
    if (dataSize !== meta.size) {
      await data.close();
      throw new Error(`data file of ${meta.digest} has ${dataSize} bytes, expected ${meta.size}`);
    }
    const lastAccess = (await stat(join(dir, META))).mtimeMs;
    const journalText = await readFile(join(dir, JOURNAL), 'utf8').catch(() => '');
    const journal = await open(join(dir, JOURNAL), fsConstants.O_CREAT | fsConstants.O_WRONLY | fsConstants.O_APPEND);
    const blob = new StoredBlob(dir, meta, data, journal, lastAccess);
    let dropped = 0;
    for (const line of journalText.split('\n')) {
      const [, indexText, check] = /^(\d+) (\S+)$/.exec(line) ?? [];
      if (indexText === undefined || check === undefined || !isPieceCheck(check)) continue; // a torn last line from a crash
      const index = Number(indexText);
      if (index >= blob.layout.pieceCount || blob.pieces.has(index)) continue;
      // A complete blob was verified as a whole and fsynced; a partial one is checked piece by piece.
      if (meta.complete || (await blob.pieceMatches(index, check))) blob.remember(index, check);
      else dropped++;
    }
    if (meta.complete && blob.pieces.size !== blob.layout.pieceCount) {
      // Metadata says complete but the journal disagrees: trust neither.
      meta.complete = false;
      await writeMetaAtomically(dir, meta);
    }
    if (dropped > 0) await blob.rewriteJournal();
    return { blob, droppedPieces: dropped };
  }

  get digest(): string {
    return this.meta.digest;
  }
  get size(): number {
    return this.meta.size;
  }
  get sources(): readonly BlobSource[] {
    return this.meta.sources;
  }
  /** Some source serves the blob to anyone. */
  get isPublic(): boolean {
    return this.meta.sources.some((source) => source.public);
  }
  get complete(): boolean {
    return this.meta.complete;
  }
  get storedBytes(): number {
    return this.bytesStored;
  }
  get storedPieceCount(): number {
    return this.pieces.size;
  }

  /** The data file's descriptor, for sendfile(2); valid while the blob is open. */
  get dataFd(): number {
    return this.data.fd;
  }

  hasPiece(index: number): boolean {
    return this.pieces.has(index);
  }

  /** The piece's SHA-256 digest, when its journal check is one. */
  pieceDigest(index: number): string | undefined {
    const check = this.pieces.get(index);
    const hex = check && checkSha256(check);
    return hex ? `sha256:${hex}` : undefined;
  }

  /** Stores a piece with the check the caller computed (see piece-check.ts). */
  async writePiece(index: number, bytes: Buffer, check: PieceCheck): Promise<void> {
    const { offset, length } = pieceBounds(this.layout, index);
    if (bytes.length !== length) throw new Error(`piece ${index} of ${this.digest} has ${bytes.length} bytes, expected ${length}`);
    if (this.pieces.has(index)) return;
    let written = 0;
    while (written < length) {
      const { bytesWritten } = await this.data.write(bytes, written, length - written, offset + written);
      written += bytesWritten;
    }
    await this.journal.appendFile(`${index} ${check}\n`);
    this.remember(index, check);
  }

  /** Reads bytes that the caller knows are stored. */
  async read(target: Buffer, position: number, length = target.length): Promise<number> {
    let total = 0;
    while (total < length) {
      const { bytesRead } = await this.data.read(target, total, length - total, position + total);
      if (bytesRead === 0) break;
      total += bytesRead;
    }
    return total;
  }

  /** Records one more registry that holds the blob (or updates whether it serves it publicly). */
  async addSource(source: BlobSource): Promise<void> {
    const same = (s: BlobSource) => s.registry === source.registry && s.repository === source.repository;
    const known = this.meta.sources.find(same);
    if (known && known.public === source.public) return;
    const sources = known ? this.meta.sources.map((s) => (same(s) ? source : s)) : [...this.meta.sources, source];
    this.meta = { ...this.meta, sources };
    await writeMetaAtomically(this.dir, this.meta);
  }

  /** Called once the whole blob matched its digest: flush, then record completeness. */
  async markComplete(): Promise<void> {
    await this.data.datasync();
    await this.journal.datasync();
    this.meta = { ...this.meta, complete: true };
    await writeMetaAtomically(this.dir, this.meta);
  }

  touch(): void {
    this.lastAccess = Date.now();
    const seconds = this.lastAccess / 1000;
    utimes(join(this.dir, META), seconds, seconds).catch(() => undefined);
  }

  async close(): Promise<void> {
    await Promise.allSettled([this.data.close(), this.journal.close()]);
  }

  async remove(): Promise<void> {
    await this.close();
    await rm(this.dir, { recursive: true, force: true });
  }

  private remember(index: number, check: PieceCheck): void {
    this.pieces.set(index, check);
    this.bytesStored += pieceBounds(this.layout, index).length;
  }

  private async pieceMatches(index: number, check: PieceCheck): Promise<boolean> {
    const { offset, length } = pieceBounds(this.layout, index);
    const buffer = Buffer.allocUnsafe(length);
    const read = await this.read(buffer, offset, length);
    return read === length && (await checkMatches(check, buffer));
  }

  private async rewriteJournal(): Promise<void> {
    const lines = [...this.pieces].map(([index, hex]) => `${index} ${hex}\n`).join('');
    const temporary = join(this.dir, `${JOURNAL}.tmp`);
    await writeFile(temporary, lines);
    await rename(temporary, join(this.dir, JOURNAL));
  }
}

async function writeMetaAtomically(dir: string, meta: BlobMeta): Promise<void> {
  const temporary = join(dir, `${META}.tmp`);
  await writeFile(temporary, JSON.stringify(meta));
  await rename(temporary, join(dir, META));
}

function parseMeta(text: string, dir: string): BlobMeta {
  const meta = JSON.parse(text) as Partial<BlobMeta>;
  if (
    meta.version !== 1 ||
    typeof meta.digest !== 'string' ||
    !Number.isSafeInteger(meta.size) ||
    !Number.isSafeInteger(meta.pieceSize) ||
    (meta.pieceSize ?? 0) <= 0
  ) {
    throw new Error(`unreadable blob metadata in ${dir}`);
  }
  const { public: wasPublic, ...rest } = meta as Partial<BlobMeta> & { public?: boolean };
  // Written before blobs recorded their sources: a public one stays public, a private one has no
  // source a client can be checked against, and is fetched again (docs/security.md).
  const sources = Array.isArray(rest.sources)
    ? rest.sources.filter(isBlobSource)
    : wasPublic
      ? [{ registry: '', repository: '', public: true }]
      : [];
  return { complete: false, createdAt: '', ...rest, sources } as BlobMeta;
}

function isBlobSource(value: unknown): value is BlobSource {
  const source = value as Partial<BlobSource> | null;
  return typeof source?.registry === 'string' && typeof source.repository === 'string' && typeof source.public === 'boolean';
}
