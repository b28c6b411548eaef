// Verified chunks on disk, content-addressed by chunk digest: <dir>/sha256/<2 hex>/<64 hex>,
// holding the chunk's uncompressed bytes. Only verified bytes are written (by ChunkFetcher),
// through a temp file and a rename, so a crash never leaves a partial chunk under its name.
// Layers share the directory: the same chunk in two layers is stored once.
//
// Reads go through a small in-memory LRU of whole chunks (ChunkMemoryCache, shared by every store
// of the process: chunks are content-addressed and verified, so a digest names one content). A
// sequential reader then costs one disk read per chunk rather than one per FUSE request, and is
// answered with slices of the cached chunk instead of a new buffer per request (which, at 1 MiB
// requests, the garbage collector otherwise spends a third of the time on). Cached buffers are
// never written to: slices handed out stay valid.
import { randomBytes } from 'node:crypto';
import fsp, { type FileHandle } from 'node:fs/promises';
import path from 'node:path';

const MAX_OPEN_FILES = 64;
/** Chunks up to this size are read whole into the memory cache; larger ones are read by range. */
const MAX_WHOLE_CHUNK = 16 << 20;
/** Where warm() reads go: their bytes are never looked at, so every store shares one buffer. */
const WARM_SCRATCH = Buffer.allocUnsafe(1 << 20);
const WARMED_REMEMBERED = 32;

/** Whole chunks in memory, least recently used first out, within a byte budget. */
export class ChunkMemoryCache {
  private readonly entries = new Map<string, Buffer>(); // LRU by insertion order
  private used = 0;

  constructor(readonly budget: number) {}

  get bytes(): number {
    return this.used;
  }

  get(digest: string): Buffer | undefined {
    const data = this.entries.get(digest);
    if (data) {
      this.entries.delete(digest); // to the young end
      this.entries.set(digest, data);
    }
    return data;
  }

  /** Keeps `data` (never modified afterwards) unless it would take more than a quarter of the budget. */
  set(digest: string, data: Buffer): void {
    if (data.length > this.budget / 4 || this.entries.has(digest)) return;
    this.entries.set(digest, data);
    this.used += data.length;
    for (const [oldest, old] of this.entries) {
      if (this.used <= this.budget) break;
      this.entries.delete(oldest);
      this.used -= old.length;
    }
  }

  delete(digest: string): void {
    const data = this.entries.get(digest);
    if (!data) return;
    this.entries.delete(digest);
    this.used -= data.length;
  }
}

/** The process's default memory cache: 64 MiB. */
export const sharedChunkMemory = new ChunkMemoryCache(64 << 20);

export interface ChunkStoreOptions {
  /** Whole-chunk memory cache (default: sharedChunkMemory); null for none. */
  memory?: ChunkMemoryCache | null;
}

export class ChunkStore {
  /** Digests known to be on disk (filled by write() and by scanning at open). */
  private readonly present = new Set<string>();
  private readonly handles = new Map<string, Promise<FileHandle>>(); // LRU by insertion order
  /** Chunk files being read ahead into the page cache, and the last ones that were. */
  private readonly warming = new Set<string>();
  private readonly warmed = new Set<string>();
  /** Whole-chunk reads in progress: one disk read per chunk, however many requests wait. */
  private readonly loading = new Map<string, Promise<Buffer | undefined>>();

  private constructor(
    readonly dir: string,
    private readonly memory: ChunkMemoryCache | undefined,
  ) {}

  static async open(dir: string, options: ChunkStoreOptions = {}): Promise<ChunkStore> {
    const store = new ChunkStore(path.resolve(dir), options.memory === null ? undefined : (options.memory ?? sharedChunkMemory));
    await fsp.mkdir(path.join(store.dir, 'sha256'), { recursive: true });
    await store.scan();
    return store;
  }

  has(digest: string): boolean {
    return this.present.has(digest);
  }

  pathOf(digest: string): string {
    const hex = digest.slice('sha256:'.length);
    if (!/^[0-9a-f]{64}$/.test(hex) || !digest.startsWith('sha256:')) throw new Error(`invalid chunk digest ${digest}`);
    return path.join(this.dir, 'sha256', hex.slice(0, 2), hex);
  }

  /** Stores verified chunk bytes under their digest. */
  async write(digest: string, data: Buffer): Promise<void> {
    if (this.present.has(digest)) return;
    const file = this.pathOf(digest);
    await fsp.mkdir(path.dirname(file), { recursive: true });
    const tmp = `${file}.${randomBytes(6).toString('hex')}.tmp`;
    try {
      await fsp.writeFile(tmp, data);
      await fsp.rename(tmp, file);
    } catch (error) {
      await fsp.rm(tmp, { force: true });
      throw error;
    }
    this.present.add(digest);
  }

  /**
   * `length` bytes from `offset` in a stored chunk; undefined when the chunk is not (or no longer
   * fully) on disk, so the caller fetches it again.
   */
  async read(digest: string, offset: number, length: number, chunkSize?: number): Promise<Buffer | undefined> {
    const cached = this.memory?.get(digest);
    if (cached && offset + length <= cached.length) return cached.subarray(offset, offset + length);
    if (!this.present.has(digest)) return undefined;
    if (this.memory && chunkSize !== undefined && chunkSize <= MAX_WHOLE_CHUNK && offset + length <= chunkSize) {
      return (await this.load(digest, chunkSize))?.subarray(offset, offset + length);
    }
    return this.readRange(digest, offset, length);
  }

  /**
   * A descriptor of a stored chunk's file, open until `release` (for a FUSE reply that reads the
   * file itself); undefined when the chunk is not, or no longer whole, on disk.
   */
  async pin(digest: string, chunkSize: number): Promise<{ fd: number; release(): void } | undefined> {
    if (!this.present.has(digest)) return undefined;
    const handle = await fsp.open(this.pathOf(digest), 'r').catch(() => undefined);
    const size = handle && (await handle.stat().catch(() => undefined))?.size;
    if (!handle || size !== chunkSize) {
      // Gone, or not the chunk the TOC describes: forget it, so the reader fetches it again.
      await handle?.close().catch(() => {});
      this.present.delete(digest);
      this.memory?.delete(digest);
      return undefined;
    }
    return { fd: handle.fd, release: () => void handle.close().catch(() => {}) };
  }

  /**
   * Starts reading a stored chunk's file on the thread pool, keeping nothing: the pages land in
   * the page cache, so a reply that reads the file itself (pin) does not wait for the disk on the
   * event loop's thread. For the chunks a sequential reader will want next.
   */
  warm(digest: string): void {
    if (!this.present.has(digest) || this.warming.has(digest) || this.warmed.has(digest)) return;
    this.warming.add(digest);
    void (async () => {
      const handle = await fsp.open(this.pathOf(digest), 'r');
      try {
        for (let position = 0; ; position += WARM_SCRATCH.length) {
          const { bytesRead } = await handle.read(WARM_SCRATCH, 0, WARM_SCRATCH.length, position);
          if (bytesRead < WARM_SCRATCH.length) break;
        }
      } finally {
        await handle.close();
      }
      this.warmed.add(digest);
      const oldest = this.warmed.values().next();
      if (this.warmed.size > WARMED_REMEMBERED && !oldest.done) this.warmed.delete(oldest.value);
    })()
      .catch(() => {})
      .finally(() => this.warming.delete(digest));
  }

  /**
   * Starts reading a stored chunk into the memory cache, without waiting: for the chunk a
   * sequential reader will want next.
   */
  preload(digest: string, chunkSize: number): void {
    if (!this.memory || chunkSize > MAX_WHOLE_CHUNK || !this.present.has(digest) || this.memory.get(digest)) return;
    void this.load(digest, chunkSize);
  }

  /** The whole chunk, read once from disk into the memory cache. */
  private load(digest: string, chunkSize: number): Promise<Buffer | undefined> {
    let loading = this.loading.get(digest);
    if (!loading) {
      loading = this.readRange(digest, 0, chunkSize).then((data) => {
        if (data) this.memory?.set(digest, data);
        return data;
      });
      loading.catch(() => {}).finally(() => this.loading.delete(digest));
      this.loading.set(digest, loading);
    }
    return loading;
  }

  private async readRange(digest: string, offset: number, length: number): Promise<Buffer | undefined> {
    if (!this.present.has(digest)) return undefined;
    const buffer = Buffer.allocUnsafe(length);
    // Two tries: a cached handle may have been closed by LRU eviction in the meantime.
    for (let attempt = 0; attempt < 2; attempt++) {
      let done = 0;
      try {
        const handle = await this.handle(digest);
        while (done < length) {
          const { bytesRead } = await handle.read(buffer, done, length - done, offset + done);
          if (bytesRead === 0) break;
          done += bytesRead;
        }
      } catch {
        this.dropHandle(digest);
        continue;
      }
      if (done === length) return buffer;
      break; // shorter than the TOC says: not a chunk we wrote
    }
    this.present.delete(digest);
    this.memory?.delete(digest);
    this.dropHandle(digest);
    return undefined;
  }

  async close(): Promise<void> {
    const handles = [...this.handles.values()];
    this.handles.clear();
    await Promise.all(handles.map(async (h) => (await h.catch(() => undefined))?.close()));
  }

  private dropHandle(digest: string): void {
    const handle = this.handles.get(digest);
    this.handles.delete(digest);
    void handle?.then((h) => h.close()).catch(() => {});
  }

  private handle(digest: string): Promise<FileHandle> {
    let handle = this.handles.get(digest);
    if (handle) {
      this.handles.delete(digest); // move to the young end
    } else {
      handle = fsp.open(this.pathOf(digest), 'r');
      handle.catch(() => this.handles.delete(digest));
      if (this.handles.size >= MAX_OPEN_FILES) {
        const [oldest, old] = this.handles.entries().next().value as [string, Promise<FileHandle>];
        this.handles.delete(oldest);
        void old.then((h) => h.close()).catch(() => {});
      }
    }
    this.handles.set(digest, handle);
    return handle;
  }

  private async scan(): Promise<void> {
    const root = path.join(this.dir, 'sha256');
    for (const prefix of await fsp.readdir(root)) {
      if (!/^[0-9a-f]{2}$/.test(prefix)) continue;
      for (const name of await fsp.readdir(path.join(root, prefix))) {
        if (/^[0-9a-f]{64}$/.test(name) && name.startsWith(prefix)) this.present.add(`sha256:${name}`);
      }
    }
  }
}
