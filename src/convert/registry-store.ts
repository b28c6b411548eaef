import type { Readable } from 'node:stream';
import { digestOf } from '../oci/digest.js';
import { RegistryClient, type Credentials, type Manifest } from '../oci/client.js';
import type { ImageReference } from '../oci/reference.js';
import type { RegistryHosts } from '../oci/registry-hosts.js';
import { registryBlobSource, type RangeSource } from '../estargz/index.js';
import type { ImageStore } from './store.js';

/** An image repository on a registry. */
export class RegistryStore implements ImageStore {
  readonly name: string;
  readonly reference?: string;
  private readonly client: RegistryClient;

  constructor(
    readonly ref: ImageReference,
    hosts: RegistryHosts,
    credentials?: Credentials,
  ) {
    this.name = `${ref.registry}/${ref.repository}`;
    this.reference = ref.digest ?? ref.tag;
    this.client = new RegistryClient(ref.registry, { hosts, credentials });
  }

  getManifest(reference: string): Promise<Manifest> {
    return this.client.getManifest(this.ref.repository, reference);
  }

  async openBlob(digest: string): Promise<Readable> {
    return (await this.client.getBlob(this.ref.repository, digest)).body;
  }

  blobSource(digest: string): Promise<RangeSource> {
    return registryBlobSource(this.client, this.ref.repository, digest);
  }

  putBlob(
    blob: { digest: string; size: number },
    localFile: () => Promise<string>,
    source?: ImageStore,
  ): Promise<'exists' | 'mounted' | 'uploaded'> {
    // A mount only works within one registry (and may still be refused: then putBlob uploads).
    const from = source instanceof RegistryStore && source.ref.registry === this.ref.registry ? source.ref.repository : undefined;
    return this.client.putBlob(this.ref.repository, blob, { from, localFile });
  }

  putManifest(bytes: Buffer, mediaType: string, tag?: string): Promise<string> {
    return this.client.putManifest(this.ref.repository, tag ?? digestOf(bytes), bytes, mediaType);
  }

  close(): Promise<void> {
    return this.client.close();
  }
}
