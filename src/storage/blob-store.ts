import { mkdir, readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from '../common/log.js';
import { parseDigest } from '../oci/digest.js';
import type { PieceCheck } from './piece-check.js';
import { pieceSizeFor } from './piece-plan.js';
import { StoredBlob, type BlobSource } from './stored-blob.js';

export interface QuotaOptions {
  /** Bytes of blob data the store may hold; 0 means no limit. */
  quota: number;
  /** Eviction starts when usage passes quota × high... */
  highWatermark: number;
  /** ...and stops once usage is below quota × low. */
  lowWatermark: number;
}

/** A blob the store cannot hold at all: bigger than its quota, or than a file may be here. */
export class BlobTooLargeError extends Error {
  override name = 'BlobTooLargeError';
}

export interface EvictionEvent {
  digest: string;
  bytes: number;
}

/**
 * The peer's on-disk content store: one StoredBlob per digest under `<root>/blobs/<alg>/<hex>`,
 * with a disk quota enforced by least-recently-used eviction that skips blobs in use.
 */
export class BlobStore {
  private readonly blobs = new Map<string, StoredBlob>();
  private readonly inUse = new Map<string, number>();
  private usage = 0;
  private evicting = false;

  private constructor(
    readonly root: string,
    private readonly quota: QuotaOptions,
    private readonly log: Logger,
    private readonly onEvict: (event: EvictionEvent) => void,
  ) {}

  static async open(
    root: string,
    quota: QuotaOptions,
    log: Logger,
    onEvict: (event: EvictionEvent) => void = () => undefined,
  ): Promise<BlobStore> {
    const store = new BlobStore(root, quota, log, onEvict);
    await store.loadExisting();
    return store;
  }

  get usedBytes(): number {
    return this.usage;
  }
  get blobCount(): number {
    return this.blobs.size;
  }

  get(digest: string): StoredBlob | undefined {
    return this.blobs.get(digest);
  }

  list(): StoredBlob[] {
    return [...this.blobs.values()];
  }

  /** Creates the on-disk record of a blob about to be fetched for `source`. */
  async create(digest: string, size: number, source: BlobSource, pieceSize = pieceSizeFor(size)): Promise<StoredBlob> {
    const existing = this.blobs.get(digest);
    if (existing) return existing;
    if (this.quota.quota > 0 && size > this.quota.quota) {
      throw new BlobTooLargeError(
        `blob ${digest} is announced with ${size} bytes, more than this peer's disk quota of ${this.quota.quota} bytes`,
      );
    }
    let blob: StoredBlob;
    try {
      blob = await StoredBlob.create(this.dirFor(digest), { digest, size, pieceSize, sources: [source] });
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code !== 'EFBIG' && code !== 'ENOSPC') throw error;
      await rm(this.dirFor(digest), { recursive: true, force: true });
      throw new BlobTooLargeError(
        `blob ${digest} is announced with ${size} bytes, more than this peer's disk can hold in one file (${code})`,
      );
    }
    this.blobs.set(digest, blob);
    return blob;
  }

  /** Forgets a blob and deletes its files (for example after it failed verification). */
  async remove(digest: string): Promise<void> {
    const blob = this.blobs.get(digest);
    if (!blob) return;
    this.blobs.delete(digest);
    this.usage -= blob.storedBytes;
    await blob.remove();
  }

  /** Writes a verified piece and accounts for it, evicting other blobs if the quota is passed. */
  async writePiece(blob: StoredBlob, index: number, bytes: Buffer, check: PieceCheck): Promise<void> {
    if (blob.hasPiece(index)) return;
    await blob.writePiece(index, bytes, check);
    if (this.blobs.get(blob.digest) === blob) this.usage += bytes.length;
    if (this.overHighWatermark()) await this.evict();
  }

  private overHighWatermark(): boolean {
    return this.quota.quota > 0 && this.usage > this.quota.quota * this.quota.highWatermark;
  }

  /** Marks a blob as in use (being read or fetched): eviction never touches it. Returns the release. */
  acquire(digest: string): () => void {
    this.inUse.set(digest, (this.inUse.get(digest) ?? 0) + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const count = (this.inUse.get(digest) ?? 1) - 1;
      if (count > 0) return void this.inUse.set(digest, count);
      this.inUse.delete(digest);
      // A blob that was in use when the store passed its high watermark was spared then: it goes now,
      // not at the next write, which may never come.
      if (this.overHighWatermark()) {
        this.evict().catch((error: Error) => this.log.warn({ err: error.message }, 'eviction failed'));
      }
    };
  }

  isInUse(digest: string): boolean {
    return this.inUse.has(digest);
  }

  /** Evicts least-recently-used blobs not in use until usage is below the low watermark. */
  async evict(): Promise<void> {
    if (this.evicting) return;
    this.evicting = true;
    try {
      const target = this.quota.quota * this.quota.lowWatermark;
      const candidates = this.list()
        .filter((blob) => !this.isInUse(blob.digest))
        .sort((a, b) => a.lastAccess - b.lastAccess);
      for (const blob of candidates) {
        if (this.usage <= target) break;
        if (this.isInUse(blob.digest)) continue;
        const bytes = blob.storedBytes;
        await this.remove(blob.digest);
        this.log.info({ digest: blob.digest, bytes }, 'evicted blob to stay within the disk quota');
        this.onEvict({ digest: blob.digest, bytes });
      }
      if (this.usage > this.quota.quota) {
        this.log.warn({ usage: this.usage, quota: this.quota.quota }, 'disk quota exceeded by blobs in use');
      }
    } finally {
      this.evicting = false;
    }
  }

  async close(): Promise<void> {
    await Promise.allSettled(this.list().map((blob) => blob.close()));
  }

  private dirFor(digest: string): string {
    const { algorithm, hex } = parseDigest(digest);
    return join(this.root, 'blobs', algorithm, hex);
  }

  private async loadExisting(): Promise<void> {
    const base = join(this.root, 'blobs');
    await mkdir(base, { recursive: true });
    for (const algorithm of await readdir(base)) {
      for (const hex of await readdir(join(base, algorithm)).catch(() => [])) {
        const dir = join(base, algorithm, hex);
        try {
          const { blob, droppedPieces } = await StoredBlob.load(dir);
          if (blob.digest !== `${algorithm}:${hex}`) throw new Error(`metadata names ${blob.digest}`);
          this.blobs.set(blob.digest, blob);
          this.usage += blob.storedBytes;
          if (droppedPieces > 0) {
            this.log.warn({ digest: blob.digest, droppedPieces }, 'discarded pieces that failed verification after restart');
          }
        } catch (error) {
          this.log.warn({ dir, err: (error as Error).message }, 'discarding unreadable blob directory');
          await rm(dir, { recursive: true, force: true });
        }
      }
    }
    this.log.info({ blobs: this.blobs.size, bytes: this.usage }, 'blob store opened');
  }
}
