import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http';
import type { ServerLimits } from '../../common/http-server.js';
import type { Registry } from 'prom-client';
import type { Logger } from '../../common/log.js';
import { serveMetrics } from '../../common/metrics.js';
import { isFromThisHost } from '../../common/net.js';
import type { ClusterToken } from '../../common/token.js';
import { parseDigest, DigestError } from '../../oci/digest.js';
import { OciError } from '../../oci/errors.js';
import { explainBadRepositoryName, isTag } from '../../oci/names.js';
import type { RegistryTransport } from '../../oci/transport.js';
import type { PeerMetrics } from '../metrics.js';
import type { BlobService } from './blobs.js';
import { passThrough } from './manifests.js';
import { API_VERSION_HEADER, ClientGoneError, sendOciError } from './respond.js';
import { splitRegistryNamespace, upstreamUrl, type UpstreamResolver } from './upstream.js';

export interface MirrorDeps {
  blobs: BlobService;
  upstreams: UpstreamResolver;
  transport: RegistryTransport;
  metricsRegistry: Registry;
  metrics: PeerMetrics;
  log: Logger;
  /** Extra read-only endpoints under /_starling/ (task listing for `starling stat`). */
  status: () => unknown;
  /** Lets a client from another host list the tasks (the local host always may). */
  clusterToken?: ClusterToken;
}

type Route =
  | { kind: 'ping' }
  | { kind: 'manifest'; name: string; reference: string }
  | { kind: 'blob'; name: string; digest: string }
  | { kind: 'tags'; name: string };

/**
 * Parses a /v2/ path from the raw request target. The raw form matters: URL parsing would
 * quietly resolve "..", and such names must be refused, not reinterpreted.
 */
export function parseRegistryPath(rawPath: string): Route {
  if (rawPath === '/v2/' || rawPath === '/v2') return { kind: 'ping' };
  if (!rawPath.startsWith('/v2/')) throw new OciError('UNSUPPORTED', `unsupported path ${rawPath}`, { status: 404 });
  const rest = rawPath.slice('/v2/'.length);
  const match = /^(.+)\/(manifests|blobs|tags)\/(.+)$/.exec(rest);
  if (!match) throw new OciError('UNSUPPORTED', `unsupported path ${rawPath}`, { status: 404 });
  const [, name, kind, target] = match as unknown as [string, string, string, string];
  const problem = explainBadRepositoryName(name);
  if (problem) throw new OciError('NAME_INVALID', problem);
  if (kind === 'tags') {
    if (target !== 'list') throw new OciError('UNSUPPORTED', `unsupported path ${rawPath}`, { status: 404 });
    return { kind: 'tags', name };
  }
  if (kind === 'blobs') {
    try {
      parseDigest(target);
    } catch (error) {
      throw new OciError('DIGEST_INVALID', (error as DigestError).message);
    }
    return { kind: 'blob', name, digest: target };
  }
  if (!isTag(target)) {
    try {
      parseDigest(target);
    } catch {
      throw new OciError('MANIFEST_INVALID', `invalid manifest reference "${target}" (neither a tag nor a digest)`, { status: 400 });
    }
  }
  return { kind: 'manifest', name, reference: target };
}

/** The registry mirror's requests: the OCI pull API plus /metrics, /healthz and /_starling/. */
export function mirrorHandler(deps: MirrorDeps): RequestListener {
  return (req, res) => void handle(deps, req, res);
}

/** The mirror's connection limits: containerd keeps its connections for a while between pulls. */
export const MIRROR_LIMITS: Partial<ServerLimits> = { keepAliveTimeoutMs: 65_000 };

async function handle(deps: MirrorDeps, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const started = performance.now();
  const rawTarget = req.url ?? '/';
  const queryAt = rawTarget.indexOf('?');
  const rawPath = queryAt >= 0 ? rawTarget.slice(0, queryAt) : rawTarget;
  const query = new URLSearchParams(queryAt >= 0 ? rawTarget.slice(queryAt + 1) : '');
  let routeName = 'other';
  try {
    if (rawPath === '/metrics') {
      routeName = 'metrics';
      return await serveMetrics(deps.metricsRegistry, res);
    }
    if (rawPath === '/healthz') {
      routeName = 'health';
      res.writeHead(200, { 'content-type': 'text/plain' });
      return void res.end('ok\n');
    }
    if (rawPath === '/_starling/tasks') {
      routeName = 'status';
      // The digests held here, private ones included: for this host, or a holder of the cluster token.
      if (!isFromThisHost(req.socket) && !deps.clusterToken?.accepts(req.headers.authorization)) {
        throw new OciError('DENIED', 'the task list is only for the local host or a holder of the cluster token', { status: 403 });
      }
      const body = JSON.stringify(deps.status());
      res.writeHead(200, { 'content-type': 'application/json' });
      return void res.end(body);
    }
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      throw new OciError('UNSUPPORTED', `${req.method} is not supported: this mirror only serves pulls`, { status: 405 });
    }
    const route = parseRegistryPath(rawPath);
    routeName = route.kind;
    // CRI-O and podman name the registry in the path (upstream.ts): the rest is the name there.
    const inPath = route.kind === 'ping' ? undefined : splitRegistryNamespace(route.name);
    if (inPath && route.kind !== 'ping') route.name = inPath.name;
    const upstream = deps.upstreams.resolve(req, query, inPath?.registry);
    if (route.kind === 'ping') {
      if (!upstream) {
        res.writeHead(200, { ...API_VERSION_HEADER, 'content-type': 'application/json' });
        return void res.end('{}');
      }
      // The ping goes upstream so that clients learn the registry's auth challenge.
      return await passThrough(req, res, upstreamUrl(upstream, '/v2/'), deps.transport);
    }
    if (!upstream) {
      throw new OciError('NAME_UNKNOWN', 'no upstream registry: the request has no ?ns= and the peer has no --registry-default', {
        status: 404,
      });
    }
    switch (route.kind) {
      case 'manifest':
        return await passThrough(req, res, upstreamUrl(upstream, `/v2/${route.name}/manifests/${route.reference}`), deps.transport);
      case 'tags':
        return await passThrough(req, res, upstreamUrl(upstream, `/v2/${route.name}/tags/list${tagQuery(query)}`), deps.transport);
      case 'blob':
        return await deps.blobs.handle(req, res, route.digest, upstreamUrl(upstream, `/v2/${route.name}/blobs/${route.digest}`));
    }
  } catch (error) {
    if (error instanceof OciError) {
      sendOciError(res, error, req.method);
    } else if (error instanceof ClientGoneError) {
      res.destroy();
    } else {
      const message = (error as Error).message;
      if (res.headersSent) {
        // Mid-stream: cut the connection so the client cannot take a partial body for a whole one.
        deps.log.warn({ path: rawPath, err: message }, 'aborting response');
        res.destroy();
      } else {
        deps.log.warn({ path: rawPath, err: message }, 'request failed');
        sendOciError(res, new OciError('UNAVAILABLE', message, { status: 502 }), req.method);
      }
    }
  } finally {
    const record = () => {
      deps.metrics.requests.inc({ route: routeName, method: req.method ?? 'GET', status: String(res.statusCode) });
      deps.metrics.requestSeconds.observe({ route: routeName }, (performance.now() - started) / 1000);
    };
    if (res.closed) record();
    else res.once('close', record);
  }
}

function tagQuery(query: URLSearchParams): string {
  const kept = new URLSearchParams();
  for (const key of ['n', 'last']) {
    const value = query.get(key);
    if (value !== null) kept.set(key, value);
  }
  const text = kept.toString();
  return text ? `?${text}` : '';
}
