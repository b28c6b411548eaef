import type { Readable } from 'node:stream';
import type { Manifest } from '../oci/client.js';
import type { RangeSource } from '../estargz/index.js';

/** What conversion needs from a source or destination, whether a registry or an OCI layout. */
export interface ImageStore {
  /** For messages: `registry/repo` or `oci:DIR`. */
  readonly name: string;
  /** The tag or digest SRC named, or the tag DST should get. */
  readonly reference?: string;
  getManifest(reference: string): Promise<Manifest>;
  /** A blob's bytes as a stream, unverified (the reader hashes them). */
  openBlob(digest: string): Promise<Readable>;
  /** Random access to a blob (eStargz detection reads its footer and TOC). */
  blobSource(digest: string): Promise<RangeSource>;
  /**
   * Makes a blob present, taking it from `source` when needed: a cross-repository mount when both
   * are repositories of one registry, else a copy through `localFile()` (called lazily).
   */
  putBlob(
    blob: { digest: string; size: number },
    localFile: () => Promise<string>,
    source?: ImageStore,
  ): Promise<'exists' | 'mounted' | 'uploaded'>;
  putManifest(bytes: Buffer, mediaType: string, tag?: string): Promise<string>;
  close(): Promise<void>;
}
