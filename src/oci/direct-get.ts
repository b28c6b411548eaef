// A plain-HTTP/1.1 GET whose body the socket reads straight into the caller's buffers.
//
// Why (issue 2, the cold pull): read through Node's streams, as undici reads it, every socket
// read of a body allocates a new 64 KiB ArrayBuffer. A peer pulling 300 MB/s from a registry
// thereby allocated ~1 GB of buffers per GB pulled, and V8 ran a full mark-compact every 64 MB of
// them: ~75 per GB, which took ~3 s of CPU on V8's helper threads and ~0.7 s on the main thread,
// besides the copy of every chunk into its piece. With `onread` the kernel writes the bytes into
// the piece buffer itself.
//
// Deliberately small: one request per connection (`connection: close`), a body framed by
// Content-Length only (a chunked or unframed answer returns undefined, having closed the
// connection, and the caller asks again through undici), no TLS. The transport decides when to
// use it (big bodies, plain-HTTP hops) and follows redirects around it.
import net from 'node:net';
import type { IncomingHttpHeaders } from 'node:http';
import { bodyText, type BufferBody, type OnFill } from './buffer-body.js';

/** Largest response head accepted (registries' heads are well under 2 KiB). */
const HEAD_LIMIT = 32 * 1024;
/** Where body bytes land when no read is waiting for them (they are copied out later). */
const SCRATCH_BYTES = 64 * 1024;
/** Time allowed for a response's head, and between its body bytes (the transport's undici agent uses them too). */
export const HEAD_TIMEOUT_MS = 60_000;
export const BODY_IDLE_TIMEOUT_MS = 120_000;

export interface DirectResponse {
  statusCode: number;
  headers: IncomingHttpHeaders;
  body: BufferBody;
}

export class DirectGetError extends Error {
  override name = 'DirectGetError';
}

interface Fill {
  /** Where this fill's bytes go (already cut to the body's remaining length). */
  target: Buffer;
  filled: number;
  onFill?: OnFill;
  /** Full (or at the body's end), waiting only for its last onFill to settle. */
  ending?: boolean;
  /** The exact buffer object handed to the socket for the next read, if it is this fill's. */
  given?: Buffer;
  resolve(n: number): void;
  reject(error: Error): void;
}

/** One connection, one exchange: the head, then the body as the caller asks for it. */
class DirectExchange implements BufferBody {
  readonly socket: net.Socket;
  private readonly scratch = Buffer.allocUnsafe(HEAD_LIMIT);
  private scratchFilled = 0;
  private headSettled = false;
  /** Body bytes not yet read from the socket. */
  private remaining = 0;
  /** Body bytes read before anyone asked for them. */
  private leftover: Buffer[] = [];
  private current?: Fill;
  /** A fill's onFill asked to wait: reads are paused until it settles. */
  private held = false;
  private failure?: Error;
  private finished = false;

  constructor(
    url: URL,
    request: string,
    private readonly onHead: (result: DirectResponse | undefined | Error) => void,
  ) {
    this.socket = net.connect({
      host: url.hostname.replace(/^\[|\]$/g, ''),
      port: Number(url.port || 80),
      noDelay: true,
      onread: { buffer: () => this.nextBuffer(), callback: (n: number, buffer: Uint8Array) => this.onData(n, buffer as Buffer) },
    });
    this.socket.setTimeout(HEAD_TIMEOUT_MS);
    this.socket.on('timeout', () =>
      this.destroy(new DirectGetError(this.headSettled ? `no body bytes from ${url.host} for ${BODY_IDLE_TIMEOUT_MS} ms` : `no response head from ${url.host} within ${HEAD_TIMEOUT_MS} ms`)),
    );
    this.socket.on('error', (error) => this.destroy(error));
    this.socket.on('end', () => this.onEnd());
    this.socket.on('close', () => this.onEnd());
    this.socket.write(request);
  }

  fill(target: Buffer, offset: number, length: number, onFill?: OnFill): Promise<number> {
    if (this.current) return Promise.reject(new DirectGetError('fill called while another fill is under way'));
    const wanted = Math.min(length, this.remaining + this.leftoverBytes());
    const fill: Fill = { target: target.subarray(offset, offset + wanted), filled: 0, onFill, resolve: () => undefined, reject: () => undefined };
    const settled = new Promise<number>((resolve, reject) => {
      fill.resolve = resolve;
      fill.reject = reject;
    });
    this.current = fill;
    // Bytes read ahead go first; they may end the fill on their own (progress settles it then).
    if (this.leftover.length) this.fromLeftover(fill);
    if (this.current !== fill || fill.ending) return settled;
    if (this.failure) this.settle(this.failure);
    else if (fill.filled === fill.target.length) this.settle(); // nothing was left to read
    else if (!this.held) this.socket.resume();
    return settled;
  }

  text(limit?: number): Promise<string> {
    return bodyText(this, limit);
  }

  destroy(error?: Error): void {
    if (!this.failure && !this.finished) this.failure = error ?? new DirectGetError('the body was dropped');
    this.socket.destroy();
    if (!this.headSettled) {
      this.headSettled = true;
      this.onHead(this.failure ?? new DirectGetError('the connection closed before a response'));
    }
    if (this.current && (this.failure || !this.current.ending)) this.settle(this.failure);
  }

  private leftoverBytes(): number {
    let bytes = 0;
    for (const chunk of this.leftover) bytes += chunk.length;
    return bytes;
  }

  /** Ends the current fill: with what it has, or with an error. */
  private settle(error?: Error): void {
    const fill = this.current;
    if (!fill) return;
    this.current = undefined;
    if (error) fill.reject(error);
    else fill.resolve(fill.filled);
  }

  private nextBuffer(): Buffer {
    if (!this.headSettled) return this.scratch.subarray(this.scratchFilled);
    const fill = this.current;
    if (fill && fill.filled < fill.target.length) return (fill.given = fill.target.subarray(fill.filled));
    // No fill is waiting for these bytes: read a little into the scratch (copied out later).
    return this.scratch.subarray(0, Math.max(1, Math.min(SCRATCH_BYTES, this.remaining)));
  }

  private onData(n: number, buffer: Buffer): boolean {
    if (!this.headSettled) return this.onHeadBytes(n);
    if (n > this.remaining) {
      this.destroy(new DirectGetError('the server sent more than its Content-Length'));
      return false;
    }
    this.remaining -= n;
    if (this.remaining === 0) {
      this.finished = true;
      this.socket.destroy(); // one exchange per connection
    }
    const fill = this.current;
    if (fill && buffer === fill.given) {
      fill.given = undefined;
      fill.filled += n;
      return this.progress(fill);
    }
    // It landed in the scratch: keep a copy, and hand it on if a fill is waiting.
    this.leftover.push(Buffer.from(buffer.subarray(0, n)));
    if (!fill) return false; // pause until someone fills
    return this.fromLeftover(fill);
  }

  /** Moves leftover bytes into the fill; returns whether reading may go on. */
  private fromLeftover(fill: Fill): boolean {
    for (let first = this.leftover[0]; first && fill.filled < fill.target.length; first = this.leftover[0]) {
      const n = first.copy(fill.target, fill.filled, 0, Math.min(first.length, fill.target.length - fill.filled));
      fill.filled += n;
      if (n === first.length) this.leftover.shift();
      else this.leftover[0] = first.subarray(n);
    }
    return this.progress(fill);
  }

  /** Tells the fill's caller, and ends the fill when it is full or the body is. */
  private progress(fill: Fill): boolean {
    const done = fill.filled === fill.target.length || (this.remaining === 0 && !this.leftover.length);
    const wait = fill.filled > 0 ? fill.onFill?.(fill.filled) : undefined;
    if (done) {
      fill.ending = true;
      const finish = () => (this.current === fill ? this.settle() : undefined);
      if (wait) void wait.then(finish, (error: Error) => this.destroy(error));
      else finish();
      return false; // the next fill resumes reading
    }
    if (!wait) return true;
    this.held = true;
    void wait.then(
      () => {
        this.held = false;
        if (this.current === fill && !this.socket.destroyed) this.socket.resume();
      },
      (error: Error) => this.destroy(error),
    );
    return false;
  }

  private onHeadBytes(n: number): boolean {
    this.scratchFilled += n;
    const end = this.scratch.subarray(0, this.scratchFilled).indexOf('\r\n\r\n');
    if (end < 0) {
      if (this.scratchFilled >= HEAD_LIMIT) this.destroy(new DirectGetError(`the response head is over ${HEAD_LIMIT} bytes`));
      return true;
    }
    let head: { statusCode: number; headers: IncomingHttpHeaders };
    try {
      head = parseHead(this.scratch.toString('latin1', 0, end));
    } catch (error) {
      this.destroy(error as Error);
      return false;
    }
    const length = Number(head.headers['content-length']);
    const framed = head.headers['transfer-encoding'] === undefined && head.headers['content-length'] !== undefined && Number.isSafeInteger(length) && length >= 0;
    const early = this.scratch.subarray(end + 4, this.scratchFilled);
    this.headSettled = true;
    if (!framed) {
      // Not a body this reader can bound: the caller asks again another way.
      this.finished = true;
      this.socket.destroy();
      this.onHead(undefined);
      return false;
    }
    if (early.length > length) {
      this.failure = new DirectGetError('the server sent more than its Content-Length');
      this.socket.destroy();
      this.onHead(this.failure);
      return false;
    }
    if (early.length) this.leftover.push(Buffer.from(early));
    this.remaining = length - early.length;
    if (this.remaining === 0) {
      this.finished = true;
      this.socket.destroy();
    } else {
      this.socket.setTimeout(BODY_IDLE_TIMEOUT_MS); // reads re-arm it
    }
    this.onHead({ ...head, body: this });
    return false; // the body waits for its first fill
  }

  private onEnd(): void {
    // A whole body's fills end as its last bytes are handed out; a failure has settled them.
    if (this.finished || this.failure) return;
    this.destroy(new DirectGetError(this.headSettled ? `the connection closed with ${this.remaining} body bytes still to come` : 'the connection closed before a response head'));
  }
}

function parseHead(text: string): { statusCode: number; headers: IncomingHttpHeaders } {
  const lines = text.split('\r\n');
  const status = /^HTTP\/1\.[01] (\d{3})/.exec(lines[0] ?? '');
  if (!status) throw new DirectGetError(`the server sent no HTTP status line (${JSON.stringify((lines[0] ?? '').slice(0, 40))})`);
  const headers: IncomingHttpHeaders = {};
  for (const line of lines.slice(1)) {
    const colon = line.indexOf(':');
    if (colon <= 0) throw new DirectGetError(`the server sent a malformed header line (${JSON.stringify(line.slice(0, 40))})`);
    const name = line.slice(0, colon).trim().toLowerCase();
    const value = line.slice(colon + 1).trim();
    const previous = headers[name];
    if (name === 'set-cookie') headers[name] = [...((previous as string[] | undefined) ?? []), value];
    else headers[name] = previous === undefined ? value : `${previous as string}, ${value}`;
  }
  return { statusCode: Number(status[1]), headers };
}

const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/**
 * GETs a plain-HTTP `url` with `headers`. Resolves once the head is in, with a body to read into
 * buffers; resolves undefined, having closed the connection, when the body is not framed by a
 * Content-Length. Rejects on a malformed answer, a broken connection or `signal`.
 */
export function directGet(url: URL, headers: Record<string, string>, signal?: AbortSignal): Promise<DirectResponse | undefined> {
  if (url.protocol !== 'http:') return Promise.reject(new DirectGetError(`directGet reads plain HTTP only, not ${url.protocol}`));
  let request = `GET ${url.pathname}${url.search} HTTP/1.1\r\nhost: ${url.host}\r\nconnection: close\r\n`;
  for (const [name, value] of Object.entries(headers)) {
    if (!TOKEN.test(name) || /[\r\n\0]/.test(value)) return Promise.reject(new DirectGetError(`invalid request header ${JSON.stringify(name)}`));
    if (/^(host|connection)$/i.test(name)) continue;
    request += `${name}: ${value}\r\n`;
  }
  request += '\r\n';
  signal?.throwIfAborted();
  return new Promise((resolve, reject) => {
    const exchange = new DirectExchange(url, request, (result) => {
      if (result instanceof Error) reject(result);
      else resolve(result);
    });
    if (signal) {
      const abort = () => exchange.destroy(signal.reason as Error);
      signal.addEventListener('abort', abort, { once: true });
      exchange.socket.once('close', () => signal.removeEventListener('abort', abort));
    }
  });
}
