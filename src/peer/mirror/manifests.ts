import type { IncomingMessage, ServerResponse } from 'node:http';
import { pipeline } from 'node:stream/promises';
import type { RegistryTransport } from '../../oci/transport.js';
import { API_VERSION_HEADER } from './respond.js';

/** Request headers a registry needs to answer a pass-through request as it would answer the client. */
const FORWARDED_REQUEST_HEADERS = ['accept', 'authorization', 'if-none-match', 'range', 'user-agent'];
/** Response headers the client needs back: content negotiation, digests and auth challenges. */
const RELAYED_RESPONSE_HEADERS = [
  'content-type',
  'content-length',
  'content-range',
  'accept-ranges',
  'docker-content-digest',
  'www-authenticate',
  'etag',
  'link',
  'retry-after',
  'oci-subject',
];

/**
 * Manifests, tag lists and the /v2/ ping go to the registry as they are: they are small and
 * mutable, and their answers (including 401 challenges) belong to the client. So do blob reads
 * that the store may not answer (named-registry.ts).
 */
export async function passThrough(req: IncomingMessage, res: ServerResponse, url: URL, transport: RegistryTransport): Promise<void> {
  const headers: Record<string, string> = {};
  for (const name of FORWARDED_REQUEST_HEADERS) {
    const value = req.headers[name];
    if (typeof value === 'string') headers[name] = value;
  }
  const method = req.method === 'HEAD' ? 'HEAD' : 'GET';
  const upstream = await transport.send(url, { method, headers });
  const out: Record<string, string> = { ...API_VERSION_HEADER };
  for (const name of RELAYED_RESPONSE_HEADERS) {
    const value = upstream.headers[name];
    if (typeof value === 'string') out[name] = value;
  }
  res.writeHead(upstream.statusCode, out);
  if (method === 'HEAD') {
    await upstream.body.dump();
    res.end();
    return;
  }
  await pipeline(upstream.body, res);
}
