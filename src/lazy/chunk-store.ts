// Verified chunks on disk, content-addressed by chunk digest: <dir>/sha256/<2 hex>/<64 hex>,
// holding the chunk's uncompressed bytes. Only verified bytes are written (by ChunkFetcher),
// through a temp file and a rename, so a crash never leaves a partial chunk under its name.
// Layers share the directory: the same chunk in two layers is stored once.
import { randomBytes } from 'node:crypto';
import fsp, { type FileHandle } from 'node:fs/promises';
import path from 'node:path';

const MAX_OPEN_FILES = 64;

export class ChunkStore {
  /** Digests known to be on disk (filled by write() and by scanning at open). */
  private readonly present = new Set<string>();
  private readonly handles = new Map<string, Promise<FileHandle>>(); // LRU by insertion order

  private constructor(readonly dir: string) {}

  static async open(dir: string): Promise<ChunkStore> {
    const store = new ChunkStore(path.resolve(dir));
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
  async read(digest: string, offset: number, length: number): Promise<Buffer | undefined> {
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
