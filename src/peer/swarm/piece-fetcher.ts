import net from 'node:net';
import tls from 'node:tls';
import { formatHostPort } from '../../common/net.js';
import { clientTlsOptions, type ClientTls } from '../../common/tls.js';

/**
 * Reads piece bodies from one parent's upload server over kept-alive HTTP/1.1 connections,
 * straight into the caller's buffer.
 *
 * Why not undici here (it still serves every other request): on a capped node link of a few
 * Mbit/s each socket read carries one or two packets, and undici's stream path costs about
 * 80 µs of JavaScript per read. Measured on the emulated cluster, that path took ~70% of a node
 * peer's CPU while it downloaded, and kept runs of 16 and more nodes CPU-bound. Here a read lands
 * in the piece buffer without a copy or a stream, and a body that trickles in is read in batches:
 * after a short read the socket rests for 20 ms, so the next read takes what queued
 * meanwhile (the kernel keeps receiving into its buffer, so the transfer does not slow down).
 */

/** Largest response head accepted; upload server heads are a few hundred bytes. */
const HEAD_LIMIT = 8 * 1024;
/** A read shorter than this, mid-body, makes the socket rest before the next. */
const BATCH_BYTES = 64 * 1024;
/**
 * Over TLS each read is one record, 16 KiB at most however much is waiting: only a shorter one
 * says the sender paused. (Taking every full record for a trickle made the socket rest 20 ms per
 * 16 KiB: 7 MB/s on loopback.)
 */
const TLS_BATCH_BYTES = 16 * 1024;
const REST_MS = 20;

export interface PieceHead {
  status: number;
  /** The body's length (Content-Length). */
  length: number;
}

export interface PieceBodyTarget {
  /** Where a 200 body goes; its length must be the response's Content-Length. */
  buffer: Buffer;
  /** Called as bytes land, with how many of the buffer are filled. */
  advance(filled: number): void;
}

/** The connection broke before the answer was whole. */
export class PieceTransferError extends Error {
  override name = 'PieceTransferError';
  constructor(
    message: string,
    /** Body bytes received before the break (a 200 whose body was cut short). */
    readonly received = 0,
    /** Whether a response head had arrived (for a 200: the parent had agreed to send the piece). */
    readonly answered = false,
  ) {
    super(message);
  }
}

/** The parent's answer is not a well-formed piece response (the connection is dropped). */
export class PieceProtocolError extends Error {
  override name = 'PieceProtocolError';
}

interface Exchange {
  head?: PieceHead;
  target?: PieceBodyTarget;
  filled: number;
  /** A non-200 body being skipped: bytes still to read. */
  skip: number;
  onHead: (head: PieceHead) => PieceBodyTarget | undefined;
  done: (error?: Error) => void;
}

/** One kept-alive connection; it serves one exchange at a time. */
class Connection {
  readonly socket: net.Socket;
  private readonly scratch = Buffer.allocUnsafe(HEAD_LIMIT);
  private scratchFilled = 0;
  exchange?: Exchange;
  reusable = true;
  private resting = false;
  private readonly batchBytes: number;

  constructor(host: string, port: number, secure: ClientTls | undefined, onClose: (conn: Connection) => void) {
    // Over TLS the decrypted bytes land in the piece buffer the same way (onread works for both).
    const options = {
      host,
      port,
      noDelay: true,
      onread: { buffer: () => this.nextBuffer(), callback: (n: number) => (this.onRead(n), true) },
    };
    this.socket = secure ? tls.connect({ ...options, ...clientTlsOptions(secure) }) : net.connect(options);
    this.batchBytes = secure ? TLS_BATCH_BYTES : BATCH_BYTES;
    this.socket.on('error', () => undefined); // 'close' follows, and reports it
    this.socket.on('close', () => {
      this.reusable = false;
      this.exchange?.done(this.breakError('the connection closed'));
      onClose(this);
    });
  }

  start(request: string, exchange: Exchange): void {
    this.exchange = exchange;
    this.socket.write(request);
  }

  destroy(): void {
    this.reusable = false;
    this.socket.destroy();
  }

  private nextBuffer(): Buffer {
    const target = this.exchange?.target;
    if (target && this.exchange!.filled < target.buffer.length) return target.buffer.subarray(this.exchange!.filled);
    // Heads, skipped bodies and anything unasked-for land in the scratch buffer.
    return this.scratch.subarray(this.scratchFilled < HEAD_LIMIT ? this.scratchFilled : 0);
  }

  private onRead(n: number): void {
    const exchange = this.exchange;
    if (!exchange) {
      this.destroy(); // bytes nobody asked for: the stream is out of step
      return;
    }
    if (exchange.target) {
      exchange.filled += n;
      exchange.target.advance(exchange.filled);
      if (exchange.filled === exchange.target.buffer.length) return this.finish();
      if (n < this.batchBytes) this.rest();
      return;
    }
    if (exchange.head) {
      // Skipping a non-200 body (a short JSON error).
      exchange.skip -= n;
      this.scratchFilled = 0;
      if (exchange.skip <= 0) return exchange.skip === 0 ? this.finish() : this.fail('sent more than its Content-Length');
      return;
    }
    this.scratchFilled += n;
    const end = this.scratch.subarray(0, this.scratchFilled).indexOf('\r\n\r\n');
    if (end < 0) {
      if (this.scratchFilled >= HEAD_LIMIT) this.fail(`sent a response head over ${HEAD_LIMIT} bytes`);
      return;
    }
    let head: PieceHead;
    try {
      head = this.parseHead(this.scratch.toString('latin1', 0, end));
    } catch (error) {
      return this.fail((error as Error).message);
    }
    exchange.head = head;
    const early = this.scratch.subarray(end + 4, this.scratchFilled);
    // The next read (of this body or of the next response's head) starts the scratch afresh.
    this.scratchFilled = 0;
    if (early.length > head.length) return this.fail('sent more than its Content-Length');
    if (head.status === 200) {
      const target = exchange.onHead(head);
      if (!target) return this.fail('piece refused by the caller');
      if (target.buffer.length !== head.length) return this.fail(`sent ${head.length} bytes where ${target.buffer.length} were expected`);
      exchange.target = target;
      early.copy(target.buffer);
      exchange.filled = early.length;
      if (early.length > 0) target.advance(exchange.filled);
      if (exchange.filled === head.length) return this.finish();
    } else {
      exchange.onHead(head);
      exchange.skip = head.length - early.length;
      if (exchange.skip === 0) return this.finish();
    }
  }

  private parseHead(text: string): PieceHead {
    const lines = text.split('\r\n');
    const status = /^HTTP\/1\.[01] (\d{3})/.exec(lines[0] ?? '');
    if (!status) throw new Error(`sent no HTTP status line (${JSON.stringify((lines[0] ?? '').slice(0, 40))})`);
    let length: number | undefined;
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(':');
      const name = line.slice(0, colon).trim().toLowerCase();
      const value = line.slice(colon + 1).trim();
      if (name === 'content-length') length = Number(value);
      else if (name === 'connection' && value.toLowerCase() === 'close') this.reusable = false;
      else if (name === 'transfer-encoding') throw new Error('sent a chunked response, where a piece needs a Content-Length');
    }
    if (length === undefined || !Number.isSafeInteger(length) || length < 0) throw new Error('sent no valid Content-Length');
    return { status: Number(status[1]), length };
  }

  private finish(): void {
    const exchange = this.exchange!;
    this.exchange = undefined;
    exchange.done();
  }

  private fail(problem: string): void {
    const exchange = this.exchange;
    this.exchange = undefined;
    exchange?.done(new PieceProtocolError(`parent ${problem}`));
    this.destroy();
  }

  private breakError(what: string): PieceTransferError {
    const exchange = this.exchange;
    return new PieceTransferError(`${what} after ${exchange?.filled ?? 0} body bytes`, exchange?.filled ?? 0, exchange?.head !== undefined);
  }

  /** Lets the kernel gather the next packets before the next read (see the file's comment). */
  private rest(): void {
    if (this.resting) return;
    this.resting = true;
    this.socket.pause();
    setTimeout(() => {
      this.resting = false;
      if (!this.socket.destroyed) this.socket.resume();
    }, REST_MS);
  }
}

export class PieceFetcher {
  private readonly idle: Connection[] = [];
  private readonly all = new Set<Connection>();
  private closed = false;
  private readonly hostHeader: string;

  constructor(
    private readonly host: string,
    private readonly port: number,
    /** Extra request header lines (each ending in CRLF), e.g. the cluster token. */
    private readonly extraHeaders = '',
    /** Reach the parent over TLS, trusting the cluster CA. */
    private readonly tls?: ClientTls,
  ) {
    this.hostHeader = formatHostPort({ host, port });
  }

  /**
   * GETs `path`. `onHead` sees the status and length; for a 200 it returns where the body goes.
   * Resolves with the head once the whole body is there (or, for other statuses, read and
   * dropped). Rejects with PieceTransferError when the connection breaks or the answer is not
   * well-formed, or with the signal's reason when aborted (the connection is then dropped).
   */
  async get(path: string, onHead: (head: PieceHead) => PieceBodyTarget | undefined, signal: AbortSignal): Promise<PieceHead> {
    if (this.closed) throw new PieceTransferError('the fetcher is closed');
    signal.throwIfAborted();
    const reused = this.idle.pop();
    try {
      return await this.exchange(reused ?? this.open(), path, onHead, signal);
    } catch (error) {
      // A kept-alive connection the server closed while idle breaks before any answer: retry once.
      if (reused && error instanceof PieceTransferError && !error.answered && !signal.aborted) {
        return this.exchange(this.open(), path, onHead, signal);
      }
      throw error;
    }
  }

  /** Drops every connection; exchanges under way fail. */
  close(): void {
    this.closed = true;
    for (const conn of this.all) conn.destroy();
    this.idle.length = 0;
  }

  private open(): Connection {
    const conn = new Connection(this.host, this.port, this.tls, (gone) => {
      this.all.delete(gone);
      const at = this.idle.indexOf(gone);
      if (at >= 0) this.idle.splice(at, 1);
    });
    this.all.add(conn);
    return conn;
  }

  private exchange(conn: Connection, path: string, onHead: Exchange['onHead'], signal: AbortSignal): Promise<PieceHead> {
    return new Promise<PieceHead>((resolve, reject) => {
      const abort = () => {
        conn.exchange = undefined;
        conn.destroy();
        reject(signal.reason);
      };
      signal.addEventListener('abort', abort, { once: true });
      const exchange: Exchange = {
        filled: 0,
        skip: 0,
        onHead,
        done: (error) => {
          signal.removeEventListener('abort', abort);
          if (error) return reject(error);
          if (conn.reusable && !this.closed) this.idle.push(conn);
          else conn.destroy();
          resolve(exchange.head!);
        },
      };
      conn.start(`GET ${path} HTTP/1.1\r\nhost: ${this.hostHeader}\r\n${this.extraHeaders}\r\n`, exchange);
    });
  }
}
