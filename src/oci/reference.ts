import { parseDigest } from './digest.js';
import { explainBadRepositoryName, isTag } from './names.js';

export const DOCKER_HUB = 'docker.io';

/** A parsed image reference: `registry/repository[:tag][@digest]`. */
export interface ImageReference {
  /** Registry host with optional port, e.g. `127.0.0.1:5000` or `docker.io`. */
  registry: string;
  repository: string;
  tag?: string;
  digest?: string;
}

export class ReferenceError extends Error {
  override name = 'ReferenceError';
}

/**
 * Parses an image reference the way Docker does: the first component is a registry when it holds
 * a "." or ":" or is "localhost"; otherwise the image lives on Docker Hub.
 */
export function parseImageReference(input: string): ImageReference {
  let rest = input.trim();
  if (!rest) throw new ReferenceError('image reference is empty');
  let digest: string | undefined;
  const at = rest.indexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    try {
      parseDigest(digest);
    } catch (error) {
      throw new ReferenceError(`image reference "${input}": ${(error as Error).message}`);
    }
  }
  let tag: string | undefined;
  const lastSlash = rest.lastIndexOf('/');
  const lastColon = rest.lastIndexOf(':');
  if (lastColon > lastSlash) {
    tag = rest.slice(lastColon + 1);
    rest = rest.slice(0, lastColon);
    if (!isTag(tag)) throw new ReferenceError(`image reference "${input}": invalid tag "${tag}"`);
  }
  let registry = DOCKER_HUB;
  const slash = rest.indexOf('/');
  const first = slash >= 0 ? rest.slice(0, slash) : '';
  if (slash >= 0 && (first.includes('.') || first.includes(':') || first === 'localhost')) {
    registry = first;
    rest = rest.slice(slash + 1);
  }
  if (registry === DOCKER_HUB && !rest.includes('/')) rest = `library/${rest}`;
  const problem = explainBadRepositoryName(rest);
  if (problem) throw new ReferenceError(`image reference "${input}": ${problem}`);
  if (!tag && !digest) tag = 'latest';
  return { registry, repository: rest, tag, digest };
}

export function formatImageReference(ref: ImageReference): string {
  return `${ref.registry}/${ref.repository}${ref.tag ? `:${ref.tag}` : ''}${ref.digest ? `@${ref.digest}` : ''}`;
}
