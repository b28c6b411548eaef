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
// connection, and the caller asks again through undici), no TLS. The bytes are read by the one
// HTTP/1.1 response reader (src/http1/), strict about what it accepts; this file is the body's
// pull-based side (fills, read-ahead, a caller's wait). The transport decides when to
// use it (big bodies, plain-HTTP hops) and follows redirects around it.
import net from 'node:net';
import type { IncomingHttpHeaders } from 'node:http';
import type { ResponseHead } from '../http1/response-head.js';
import { ResponseReader, type BodySink } from '../http1/response-reader.js';
import { bodyText, type BufferBody, type OnFill } from './buffer-body.js';

/** Largest response head accepted (registries' heads are well under 2 KiB); body bytes no fill waits for land in a scratch this large too. */
const HEAD_LIMIT = 32 * 1024;
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
  resolve(n: number): void;
  reject(error: Error): void;
}

/** One connection, one exchange: the head, then the body as the caller asks for it. Its bytes are read by the one HTTP/1.1 reader (src/http1/). */
class DirectExchange implements BufferBody {
  readonly socket: net.Socket;
  private readonly reader: ResponseReader;
  private headSettled = false;
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
    this.reader = new ResponseReader(HEAD_LIMIT, {
      head: (head) => this.headIn(head),
      end: () => {
        this.finished = true;
        this.socket.destroy(); // one exchange per connection
      },
      failed: (error) => this.destroy(new DirectGetError(`the server ${error.message}`)),
    });
    this.socket = net.connect({
      host: url.hostname.replace(/^\[|\]$/g, ''),
      port: Number(url.port || 80),
      noDelay: true,
      onread: { buffer: () => this.reader.buffer(), callback: (n: number) => this.reader.read(n) },
    });
    this.socket.setTimeout(HEAD_TIMEOUT_MS);
    this.socket.on('timeout', () =>
      this.destroy(
        new DirectGetError(
          this.headSettled
            ? `no body bytes from ${url.host} for ${BODY_IDLE_TIMEOUT_MS} ms`
            : `no response head from ${url.host} within ${HEAD_TIMEOUT_MS} ms`,
        ),
      ),
    );
    this.socket.on('error', (error) => this.destroy(error));
    this.socket.on('end', () => this.onEnd());
    this.socket.on('close', () => this.onEnd());
    this.reader.expect();
    this.socket.write(request);
  }

  fill(target: Buffer, offset: number, length: number, onFill?: OnFill): Promise<number> {
    if (this.current) return Promise.reject(new DirectGetError('fill called while another fill is under way'));
    const wanted = Math.min(length, this.reader.bodyRemaining + this.leftoverBytes());
    const fill: Fill = {
      target: target.subarray(offset, offset + wanted),
      filled: 0,
      onFill,
      resolve: () => undefined,
      reject: () => undefined,
    };
    const settled = new Promise<number>((resolve, reject) => {
      fill.resolve = resolve;
      fill.reject = reject;
    });
    this.current = fill;
    // Bytes read ahead go first; they may end the fill on their own (progress settles it then).
    if (this.leftover.length) this.fromLeftover(fill);
    if (this.current !== fill || fill.ending) return settled;
    if (this.failure) this.settle(this.failure);
    else if (fill.filled === fill.target.length)
      this.settle(); // nothing was left to read
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

  /** The head is in: a Content-Length body is the caller's to read; any other is asked for again another way. */
  private headIn(head: ResponseHead): BodySink | 'stop' {
    this.headSettled = true;
    if (head.framing.kind === 'chunked' || head.framing.kind === 'until-close') {
      // Not a body this reader can bound: the caller asks again through undici.
      this.finished = true;
      this.socket.destroy();
      this.onHead(undefined);
      return 'stop';
    }
    this.socket.setTimeout(BODY_IDLE_TIMEOUT_MS); // reads re-arm it
    this.onHead({ statusCode: head.status, headers: head.headers, body: this });
    return {
      // The socket reads into the waiting fill's buffer; with none waiting, into the reader's scratch.
      into: () => {
        const fill = this.current;
        return fill && !fill.ending && fill.filled < fill.target.length ? fill.target.subarray(fill.filled) : undefined;
      },
      landed: (n) => {
        const fill = this.current;
        if (!fill) return false;
        fill.filled += n;
        return this.progress(fill);
      },
      took: (bytes) => {
        // It landed in the scratch: keep a copy, and hand it on if a fill is waiting.
        this.leftover.push(Buffer.from(bytes));
        const fill = this.current;
        return fill ? this.fromLeftover(fill) : false; // pause until someone fills
      },
    };
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
    const done = fill.filled === fill.target.length || (this.reader.bodyRemaining === 0 && !this.leftover.length);
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

  private onEnd(): void {
    // A whole body's fills end as its last bytes are handed out; a failure has settled them.
    if (this.finished || this.failure) return;
    this.destroy(
      new DirectGetError(
        this.headSettled
          ? `the connection closed with ${this.reader.bodyRemaining} body bytes still to come`
          : 'the connection closed before a response head',
      ),
    );
  }
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
    if (!TOKEN.test(name) || /[\r\n\0]/.test(value))
      return Promise.reject(new DirectGetError(`invalid request header ${JSON.stringify(name)}`));
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
