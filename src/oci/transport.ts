import { Agent, request, type Dispatcher } from 'undici';
import type { IncomingHttpHeaders } from 'node:http';

export interface TransportRequest {
  method?: 'GET' | 'HEAD';
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** Redirects to follow; registries often redirect blob reads to object storage. */
  maxRedirects?: number;
}

export interface TransportResponse {
  statusCode: number;
  headers: IncomingHttpHeaders;
  body: Dispatcher.ResponseData['body'];
  /** The URL that finally answered, after redirects. */
  url: URL;
}

/**
 * HTTP transport towards registries: keep-alive connections through one undici Agent, and
 * redirects followed by hand so that credentials never travel to another origin.
 */
export class RegistryTransport {
  readonly dispatcher: Dispatcher;

  constructor(options: { connections?: number; dispatcher?: Dispatcher } = {}) {
    this.dispatcher =
      options.dispatcher ??
      new Agent({
        connections: options.connections ?? 64,
        keepAliveTimeout: 30_000,
        headersTimeout: 60_000,
        bodyTimeout: 120_000,
      });
  }

  async send(url: URL, options: TransportRequest = {}): Promise<TransportResponse> {
    let current = url;
    let headers = { ...(options.headers ?? {}) };
    const maxRedirects = options.maxRedirects ?? 5;
    for (let hop = 0; ; hop++) {
      const response = await request(current, {
        method: options.method ?? 'GET',
        headers,
        signal: options.signal,
        dispatcher: this.dispatcher,
      });
      const location = response.headers.location;
      if ([301, 302, 303, 307, 308].includes(response.statusCode) && typeof location === 'string') {
        await response.body.dump();
        if (hop >= maxRedirects) throw new Error(`too many redirects from ${url.origin}`);
        const next = new URL(location, current);
        if (next.origin !== current.origin) {
          // Object storage behind a redirect authenticates by the signed URL, not by our token.
          headers = Object.fromEntries(Object.entries(headers).filter(([key]) => key.toLowerCase() !== 'authorization'));
        }
        current = next;
        continue;
      }
      return { statusCode: response.statusCode, headers: response.headers, body: response.body, url: current };
    }
  }

  async close(): Promise<void> {
    await this.dispatcher.close();
  }
}
