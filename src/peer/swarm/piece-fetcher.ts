import net from 'node:net';
import tls from 'node:tls';
import { formatHostPort } from '../../common/net.js';
import { clientTlsOptions, type ClientTls } from '../../common/tls.js';
import type { ResponseHead } from '../../http1/response-head.js';
import { ResponseReader, type BodySink } from '../../http1/response-reader.js';

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
  onHead: (head: PieceHead) => PieceBodyTarget | undefined;
  done: (error?: Error) => void;
}

/** One kept-alive connection; it serves one exchange at a time. Its bytes are read by the one HTTP/1.1 reader (src/http1/). */
class Connection {
  readonly socket: net.Socket;
  private readonly reader: ResponseReader;
  exchange?: Exchange;
  reusable = true;
  private resting = false;
  private readonly batchBytes: number;

  constructor(host: string, port: number, secure: ClientTls | undefined, onClose: (conn: Connection) => void) {
    this.reader = new ResponseReader(HEAD_LIMIT, {
      head: (head) => this.onHead(head),
      end: () => this.finish(),
      failed: (error) => this.fail(error.message),
    });
    // Over TLS the decrypted bytes land in the piece buffer the same way (onread works for both).
    const options = {
      host,
      port,
      noDelay: true,
      onread: { buffer: () => this.reader.buffer(), callback: (n: number) => this.reader.read(n) },
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
    this.reader.expect();
    this.socket.write(request);
  }

  destroy(): void {
    this.reusable = false;
    this.socket.destroy();
  }

  /** A piece response's head: a 200's body goes into the caller's buffer, any other's is read and dropped. */
  private onHead(response: ResponseHead): BodySink | 'discard' | 'stop' {
    const exchange = this.exchange;
    if (!exchange) return 'stop';
    const { framing } = response;
    // A body not framed by a Content-Length: the reader names what is wrong with it.
    if (framing.kind === 'chunked' || framing.kind === 'until-close') return 'discard';
    if (!response.keepAlive) this.reusable = false;
    const head: PieceHead = { status: response.status, length: framing.kind === 'length' ? framing.length : 0 };
    exchange.head = head;
    if (head.status !== 200) {
      exchange.onHead(head);
      return 'discard';
    }
    const target = exchange.onHead(head);
    if (!target) return this.fail('piece refused by the caller');
    if (target.buffer.length !== head.length) return this.fail(`sent ${head.length} bytes where ${target.buffer.length} were expected`);
    exchange.target = target;
    return {
      into: () => target.buffer.subarray(exchange.filled),
      landed: (n) => {
        exchange.filled += n;
        target.advance(exchange.filled);
        if (exchange.filled < target.buffer.length && n < this.batchBytes) this.rest();
        return true;
      },
      // Body bytes that came with the head.
      took: (bytes) => {
        exchange.filled += bytes.copy(target.buffer, exchange.filled);
        target.advance(exchange.filled);
        return true;
      },
    };
  }

  private finish(): void {
    const exchange = this.exchange;
    this.exchange = undefined;
    exchange?.done();
  }

  private fail(problem: string): 'stop' {
    const exchange = this.exchange;
    this.exchange = undefined;
    exchange?.done(new PieceProtocolError(`parent ${problem}`));
    this.destroy();
    return 'stop';
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
        onHead,
        done: (error) => {
          signal.removeEventListener('abort', abort);
          if (error) return reject(error);
          const head = exchange.head;
          if (!head) return reject(new PieceProtocolError('parent ended an exchange without a response head'));
          if (conn.reusable && !this.closed) this.idle.push(conn);
          else conn.destroy();
          resolve(head);
        },
      };
      conn.start(`GET ${path} HTTP/1.1\r\nhost: ${this.hostHeader}\r\n${this.extraHeaders}\r\n`, exchange);
    });
  }
}
