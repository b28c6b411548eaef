import type { IncomingMessage } from 'node:http';
import { OciError } from '../../oci/errors.js';
import { isRegistryHost, type RegistryHosts } from '../../oci/registry-hosts.js';

/** Header a hosts.toml can set to name the upstream registry when `?ns=` is not sent. */
export const REGISTRY_HEADER = 'x-starling-registry';

/** The registry a mirror request is meant for. */
export interface Upstream {
  /** Registry host as the client named it (e.g. `127.0.0.1:5000`). */
  registry: string;
  baseUrl: URL;
}

/**
 * Picks the upstream registry of a request: containerd's `?ns=` query first, then the
 * X-Starling-Registry header, then the configured default registry.
 */
export class UpstreamResolver {
  constructor(
    private readonly hosts: RegistryHosts,
    private readonly defaultRegistry?: URL,
  ) {}

  resolve(request: IncomingMessage, query: URLSearchParams): Upstream | undefined {
    const named = query.get('ns') ?? headerValue(request, REGISTRY_HEADER);
    if (named !== undefined && named !== null && named !== '') {
      if (!isRegistryHost(named)) throw new OciError('NAME_INVALID', `invalid upstream registry "${named}"`);
      if (this.defaultRegistry && this.defaultRegistry.host === named.toLowerCase()) {
        return { registry: named, baseUrl: this.defaultRegistry };
      }
      return { registry: named, baseUrl: this.hosts.baseUrl(named) };
    }
    if (this.defaultRegistry) return { registry: this.defaultRegistry.host, baseUrl: this.defaultRegistry };
    return undefined;
  }
}

export function upstreamUrl(upstream: Upstream, path: string): URL {
  return new URL(path, upstream.baseUrl);
}

function headerValue(request: IncomingMessage, name: string): string | undefined {
  const value = request.headers[name];
  return Array.isArray(value) ? value[0] : value;
}
