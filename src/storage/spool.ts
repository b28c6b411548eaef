// Files that hold a registry's answer until it is verified: a blob read from a registry that is no
// source of the copy stored here (peer/mirror/named-registry.ts) must match its digest before any
// byte of it is served, and such a blob can be far larger than memory. Spooled bytes are not part
// of the store: they are deleted once served, and whatever a crash left is deleted at start-up.
import { randomBytes } from 'node:crypto';
import { mkdir, open, rm, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { BlobTooLargeError } from './blob-store.js';

export interface SpoolFile {
  readonly handle: FileHandle;
  /** Closes and deletes the file. */
  discard(): Promise<void>;
}

export class Spool {
  private constructor(
    private readonly dir: string,
    /** Bytes one spooled blob may have (the store's quota); 0: no limit. */
    private readonly limit: number,
  ) {}

  static async open(dir: string, limit: number): Promise<Spool> {
    await rm(dir, { recursive: true, force: true });
    await mkdir(dir, { recursive: true });
    return new Spool(dir, limit);
  }

  /** A new empty file for a blob announced with `size` bytes. */
  async create(size: number): Promise<SpoolFile> {
    if (this.limit > 0 && size > this.limit) {
      throw new BlobTooLargeError(
        `a blob announced with ${size} bytes cannot be verified here: more than this peer's disk quota of ${this.limit} bytes`,
      );
    }
    const path = join(this.dir, randomBytes(12).toString('hex'));
    const handle = await open(path, 'wx+', 0o600);
    return {
      handle,
      discard: async () => {
        await handle.close().catch(() => undefined);
        await rm(path, { force: true });
      },
    };
  }
}
