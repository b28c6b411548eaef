import type { RegistryClient } from '../oci/client.js';
import { EstargzError } from './errors.js';
import { checkRange, type RangeSource } from './source.js';

/**
 * A RangeSource over a registry blob: every read is one HTTP Range request, so opening a layer
 * costs a HEAD, the footer and the TOC, and a file costs only its chunks.
 */
export async function registryBlobSource(client: RegistryClient, repository: string, digest: string): Promise<RangeSource> {
  const size = await client.headBlob(repository, digest);
  if (size === undefined) throw new EstargzError('NOT_FOUND', `blob ${digest} is not in ${client.registry}/${repository}`);
  if (!Number.isSafeInteger(size)) throw new EstargzError('INPUT', `registry ${client.registry} gave no size for blob ${digest}`);
  return {
    size,
    async read(offset, length) {
      checkRange(size, offset, length);
      return client.readBlobRange(repository, digest, offset, length);
    },
  };
}
