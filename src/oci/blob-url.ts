import { parseDigest } from './digest.js';
import { isRepositoryName } from './names.js';

/** A blob as one registry serves it: `<registry>/v2/<repository>/blobs/<digest>`. */
export interface BlobLocation {
  /** The registry's origin, scheme://host[:port]. */
  registry: string;
  repository: string;
  digest: string;
}

export function blobUrl(location: BlobLocation): URL {
  return new URL(`/v2/${location.repository}/blobs/${location.digest}`, location.registry);
}

/** Reads a registry blob URL back into its parts; throws, naming the problem, for anything else. */
export function parseBlobUrl(url: URL | string): BlobLocation {
  const parsed = typeof url === 'string' ? new URL(url) : url;
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') throw new Error(`${parsed.protocol} is not a registry URL scheme`);
  const [, repository, digest] = /^\/v2\/(.+)\/blobs\/([^/]+)$/.exec(parsed.pathname) ?? [];
  if (repository === undefined || digest === undefined || !isRepositoryName(repository)) {
    throw new Error(`${parsed.pathname} is not a registry blob path (/v2/<repository>/blobs/<digest>)`);
  }
  return { registry: parsed.origin, repository, digest: parseDigest(digest).value };
}
