import { DOCKER_HUB } from './reference.js';

/**
 * Maps a registry host name (as in image references and containerd's `?ns=`) to the base URL
 * Starling talks to. Registries listed as insecure are reached over plain HTTP, as Docker's
 * `insecure-registries` does; every other one over HTTPS.
 */
export class RegistryHosts {
  private readonly insecure: Set<string>;

  constructor(insecureRegistries: Iterable<string> = []) {
    this.insecure = new Set([...insecureRegistries].map((host) => host.toLowerCase()));
  }

  baseUrl(registry: string): URL {
    const host = registry.toLowerCase();
    if (host === DOCKER_HUB || host === 'index.docker.io') return new URL('https://registry-1.docker.io');
    const scheme = this.insecure.has(host) ? 'http' : 'https';
    return new URL(`${scheme}://${host}`);
  }

  isInsecure(registry: string): boolean {
    return this.insecure.has(registry.toLowerCase());
  }
}

/** Checks that a registry host named by a client is a plain `host[:port]`, nothing that reshapes a URL. */
export function isRegistryHost(value: string): boolean {
  return /^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:.]+\])(?::\d{1,5})?$/.test(
    value,
  );
}
