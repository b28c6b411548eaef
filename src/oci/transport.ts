import { Agent, request, type Dispatcher } from 'undici';
import type { IncomingHttpHeaders } from 'node:http';
import { chunkedBufferBody, type BufferBody } from './buffer-body.js';
import { BODY_IDLE_TIMEOUT_MS, directGet, HEAD_TIMEOUT_MS } from './direct-get.js';

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

/** A response whose body is read into the caller's buffers (buffer-body.ts). */
export interface BufferResponse {
  statusCode: number;
  headers: IncomingHttpHeaders;
  body: BufferBody;
  url: URL;
}

/** Bodies at least this big, from plain-HTTP hops, skip undici's streams (see direct-get.ts). */
export const DIRECT_BODY_MIN_BYTES = 16 * 1024 * 1024;

interface Hop {
  statusCode: number;
  headers: IncomingHttpHeaders;
  /** Drops the body of a hop that is only a redirect. */
  discard(): Promise<void>;
}

/**
 * HTTP transport towards registries: keep-alive connections through one undici Agent (big
 * plain-HTTP bodies read into buffers go through direct-get.ts instead), and redirects followed
 * by hand so that credentials never travel to another origin.
 */
export class RegistryTransport {
  readonly dispatcher: Dispatcher;

  constructor(options: { connections?: number; dispatcher?: Dispatcher } = {}) {
    this.dispatcher =
      options.dispatcher ??
      new Agent({
        connections: options.connections ?? 64,
        keepAliveTimeout: 30_000,
        headersTimeout: HEAD_TIMEOUT_MS,
        bodyTimeout: BODY_IDLE_TIMEOUT_MS,
      });
  }

  async send(url: URL, options: TransportRequest = {}): Promise<TransportResponse> {
    return this.follow(url, options, async (current, headers) => {
      const response = await this.undiciHop(current, headers, options);
      return { ...response, discard: () => response.body.dump(), value: response.body };
    });
  }

  /**
   * A GET whose body the caller reads into its own buffers. When the body is expected to be big
   * (`expectedBytes`) and a hop is plain HTTP, that hop is read by direct-get.ts, without undici's
   * per-read buffers; otherwise undici's chunks are copied into the caller's buffers.
   */
  async sendForBuffers(url: URL, options: Omit<TransportRequest, 'method'> & { expectedBytes: number }): Promise<BufferResponse> {
    return this.follow(url, options, async (current, headers) => {
      if (current.protocol === 'http:' && options.expectedBytes >= DIRECT_BODY_MIN_BYTES) {
        const direct = await directGet(current, headers, options.signal);
        // undefined: an answer without a Content-Length, asked again below.
        if (direct) return { ...direct, discard: async () => direct.body.destroy(), value: direct.body };
      }
      const response = await this.undiciHop(current, headers, options);
      return { ...response, discard: () => response.body.dump(), value: chunkedBufferBody(response.body) };
    });
  }

  private async undiciHop(url: URL, headers: Record<string, string>, options: TransportRequest): Promise<Dispatcher.ResponseData> {
    const response = await request(url, { method: options.method ?? 'GET', headers, signal: options.signal, dispatcher: this.dispatcher });
    // Read errors reach the caller through reading. A body destroyed before anything read it (a
    // status or length the caller refuses) emits an 'error' no reader hears, and an 'error' nobody
    // listens to ends the process: a registry answering 500 to a ranged re-read did (bench/soak.ts).
    response.body.on('error', () => undefined);
    return response;
  }

  /** Sends `hop` requests until one is not a redirect, keeping credentials to their origin. */
  private async follow<B>(
    url: URL,
    options: TransportRequest,
    hop: (url: URL, headers: Record<string, string>) => Promise<Hop & { value: B }>,
  ) {
    let current = url;
    let headers = { ...(options.headers ?? {}) };
    const maxRedirects = options.maxRedirects ?? 5;
    for (let count = 0; ; count++) {
      const response = await hop(current, headers);
      const location = response.headers.location;
      if ([301, 302, 303, 307, 308].includes(response.statusCode) && typeof location === 'string') {
        await response.discard();
        if (count >= maxRedirects) throw new Error(`too many redirects from ${url.origin}`);
        const next = new URL(location, current);
        if (next.origin !== current.origin) {
          // Object storage behind a redirect authenticates by the signed URL, not by our token.
          headers = Object.fromEntries(Object.entries(headers).filter(([key]) => key.toLowerCase() !== 'authorization'));
        }
        current = next;
        continue;
      }
      return { statusCode: response.statusCode, headers: response.headers, body: response.value, url: current };
    }
  }

  async close(): Promise<void> {
    await this.dispatcher.close();
  }
}
