import type { IncomingMessage } from 'node:http';
import { OciError } from '../../oci/errors.js';
import { isRegistryHost, type RegistryHosts } from '../../oci/registry-hosts.js';

/** Header a hosts.toml can set to name the upstream registry when `?ns=` is not sent. */
export const REGISTRY_HEADER = 'x-starling-registry';

/**
 * The first path component of a repository name that carries its registry: CRI-O and podman send
 * a mirror neither `?ns=` nor a header, but a registries.conf mirror location may hold a
 * namespace, so `location = "127.0.0.1:65001/starling-registry/reg.example__5000"` sends
 * `reg.example:5000/team/app` as /v2/starling-registry/reg.example__5000/team/app/….
 */
const REGISTRY_NAMESPACE = 'starling-registry';

/**
 * The mirror namespace that names `registry` (host[:port]). A repository name holds no ':', so the
 * port follows `__`, which no host name holds; IPv6 literals have no such spelling.
 */
export function registryNamespace(registry: string): string {
  if (!isRegistryHost(registry) || registry.startsWith('[')) {
    throw new Error(`registry "${registry}" cannot be named in a mirror path (expected HOST[:PORT] with a host name or an IPv4 address)`);
  }
  return `${REGISTRY_NAMESPACE}/${registry.toLowerCase().replace(':', '__')}`;
}

/** A repository name that starts with a registry namespace: the registry, and the name there. */
export function splitRegistryNamespace(name: string): { registry: string; name: string } | undefined {
  const match = /^starling-registry\/([a-z0-9.-]+?)(?:__(\d{1,5}))?\/(.+)$/.exec(name);
  if (!match) return undefined;
  const [, host, port, rest] = match as unknown as [string, string, string | undefined, string];
  const registry = port === undefined ? host : `${host}:${port}`;
  if (!isRegistryHost(registry)) throw new OciError('NAME_INVALID', `invalid upstream registry "${registry}" in the path`);
  return { registry, name: rest };
}

/** The registry a mirror request is meant for. */
export interface Upstream {
  /** Registry host as the client named it (e.g. `127.0.0.1:5000`). */
  registry: string;
  baseUrl: URL;
}

/**
 * Picks the upstream registry of a request: the registry its path names (CRI-O, podman), else
 * containerd's `?ns=` query, then the X-Starling-Registry header, then the configured default
 * registry.
 */
export class UpstreamResolver {
  constructor(
    private readonly hosts: RegistryHosts,
    private readonly defaultRegistry?: URL,
  ) {}

  resolve(request: IncomingMessage, query: URLSearchParams, registryInPath?: string): Upstream | undefined {
    const named = registryInPath ?? query.get('ns') ?? headerValue(request, REGISTRY_HEADER);
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
