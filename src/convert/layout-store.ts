import { createReadStream } from 'node:fs';
import { copyFile, mkdir, readFile, rename, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { UserError } from '../common/errors.js';
import { fileSource, type RangeSource } from '../estargz/index.js';
import type { Manifest } from '../oci/client.js';
import { digestOf, parseDigest } from '../oci/digest.js';
import { MediaType } from '../oci/media-types.js';
import type { Descriptor, ImageIndex } from './oci-types.js';
import type { ImageStore } from './store.js';

const REF_NAME = 'org.opencontainers.image.ref.name';

/** An OCI image layout directory (image-spec "image-layout"): oci-layout, index.json, blobs/. */
export class LayoutStore implements ImageStore {
  readonly name: string;

  constructor(
    readonly dir: string,
    readonly reference?: string,
  ) {
    this.name = `oci:${dir}`;
  }

  async getManifest(reference: string): Promise<Manifest> {
    let descriptor: Descriptor | undefined;
    if (reference.includes(':')) {
      descriptor = { digest: reference, mediaType: '', size: 0 };
    } else {
      const index = await this.readIndex();
      const tagged = index.manifests.filter((m) => m.annotations?.[REF_NAME] === reference);
      descriptor = tagged[0];
      if (!descriptor) throw new UserError(`${this.name}: no manifest tagged "${reference}" in index.json`);
    }
    const bytes = await readFile(this.blobPath(descriptor.digest)).catch((error: Error) => {
      throw new UserError(`${this.name}: manifest ${descriptor.digest}: ${error.message}`);
    });
    if (digestOf(bytes) !== descriptor.digest) throw new UserError(`${this.name}: blob ${descriptor.digest} does not match its digest`);
    const mediaType = descriptor.mediaType || String((JSON.parse(bytes.toString('utf8')) as { mediaType?: string }).mediaType ?? '');
    return { bytes, mediaType, digest: descriptor.digest };
  }

  /** The tag to use when SRC names none: the only tagged manifest (or the only one at all). */
  async defaultReference(): Promise<string> {
    const index = await this.readIndex();
    const [only, ...others] = index.manifests;
    if (only && others.length === 0) return only.annotations?.[REF_NAME] ?? only.digest;
    throw new UserError(`${this.name} holds ${index.manifests.length} manifests; name one as oci:DIR:TAG`);
  }

  async openBlob(digest: string): Promise<Readable> {
    const path = this.blobPath(digest);
    await stat(path).catch((error: Error) => {
      throw new UserError(`${this.name}: blob ${digest}: ${error.message}`);
    });
    return createReadStream(path, { highWaterMark: 1 << 20 });
  }

  blobSource(digest: string): Promise<RangeSource> {
    return fileSource(this.blobPath(digest));
  }

  async putBlob(blob: { digest: string; size: number }, localFile: () => Promise<string>): Promise<'exists' | 'uploaded'> {
    const target = this.blobPath(blob.digest);
    const existing = await stat(target).catch(() => undefined);
    if (existing?.size === blob.size) return 'exists';
    await mkdir(join(this.dir, 'blobs', 'sha256'), { recursive: true });
    const temp = `${target}.tmp-${process.pid}`;
    await copyFile(await localFile(), temp);
    await rename(temp, target); // readers never see a partial blob
    return 'uploaded';
  }

  async putManifest(bytes: Buffer, mediaType: string, tag?: string): Promise<string> {
    const digest = digestOf(bytes);
    await this.ensureLayout();
    await writeAtomic(this.blobPath(digest), bytes);
    if (tag !== undefined) {
      const index = await this.readIndex().catch(() => ({ schemaVersion: 2, mediaType: MediaType.OciIndex, manifests: [] }));
      index.manifests = index.manifests.filter((m) => m.annotations?.[REF_NAME] !== tag);
      index.manifests.push({ mediaType, digest, size: bytes.length, annotations: { [REF_NAME]: tag } });
      await writeAtomic(join(this.dir, 'index.json'), Buffer.from(JSON.stringify(index)));
    }
    return digest;
  }

  async close(): Promise<void> {}

  private async ensureLayout(): Promise<void> {
    await mkdir(join(this.dir, 'blobs', 'sha256'), { recursive: true });
    const marker = join(this.dir, 'oci-layout');
    if (!(await stat(marker).catch(() => undefined))) await writeFile(marker, JSON.stringify({ imageLayoutVersion: '1.0.0' }));
  }

  private async readIndex(): Promise<ImageIndex> {
    const text = await readFile(join(this.dir, 'index.json'), 'utf8').catch((error: Error) => {
      throw new UserError(`${this.name} is not an OCI image layout: ${error.message}`);
    });
    try {
      const index = JSON.parse(text) as ImageIndex;
      if (!Array.isArray(index.manifests)) throw new Error('"manifests" is not an array');
      return index;
    } catch (error) {
      throw new UserError(`${this.name}/index.json: ${(error as Error).message}`);
    }
  }

  private blobPath(digest: string): string {
    const { algorithm, hex } = parseDigest(digest);
    return join(this.dir, 'blobs', algorithm, hex);
  }
}

async function writeAtomic(path: string, bytes: Buffer): Promise<void> {
  const temp = `${path}.tmp-${process.pid}`;
  await writeFile(temp, bytes);
  await rename(temp, path);
}
