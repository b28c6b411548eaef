// The one HTTP/1.1 response reader of the peer's own clients (src/oci/direct-get.ts for registry
// blobs, src/peer/swarm/piece-fetcher.ts for pieces): the socket reads the head into a scratch
// buffer and the body straight into the caller's buffers (`onread`), so a body costs neither a
// stream nor a copy. The reader owns the bytes' meaning — where the head ends, what it says, how
// long the body is, that no byte goes past it; its users own their sockets, timeouts, pools and
// how a caller asks for the body.
import { headEnd, Http1ResponseError, parseResponseHead, type ResponseHead } from './response-head.js';

/** Where a body's bytes go. */
export interface BodySink {
  /** The buffer the next body bytes should land in, or undefined to take them through `took`. */
  into(): Buffer | undefined;
  /** `n` bytes landed at the start of the buffer `into` last gave. False pauses the socket. */
  landed(n: number): boolean;
  /** Body bytes that landed in the reader's scratch (a view, valid during the call only). False pauses the socket. */
  took(bytes: Buffer): boolean;
}

export interface ResponseEvents {
  /**
   * A final response's head (1xx heads are skipped). Returns where its Content-Length body goes,
   * 'discard' to read and drop it, or 'stop' when the caller ends the exchange here (the reader
   * then reads nothing more: the caller closes the connection). A body framed other than by a
   * Content-Length can only be stopped at.
   */
  head(head: ResponseHead): BodySink | 'discard' | 'stop';
  /** The body is whole (also at once for a body of 0 bytes). */
  end(): void;
  /** The answer broke the protocol; the connection is of no further use. */
  failed(error: Http1ResponseError): void;
}

type State = 'idle' | 'head' | 'body' | 'discard' | 'stopped';

/**
 * Reads the responses on one connection, one exchange at a time: `expect` before each request,
 * `buffer` and `read` as the socket's `onread`.
 */
export class ResponseReader {
  private readonly scratch: Buffer;
  private scratchFilled = 0;
  private state: State = 'idle';
  private remaining = 0;
  private sink?: BodySink;
  /** The buffer handed to the socket for the current read. */
  private given?: Buffer;

  constructor(
    /** Largest head accepted, in bytes; the scratch is this large. */
    private readonly headLimit: number,
    private readonly events: ResponseEvents,
  ) {
    this.scratch = Buffer.allocUnsafe(headLimit);
  }

  /** A request went out: the next bytes are its response. */
  expect(): void {
    this.state = 'head';
    this.scratchFilled = 0;
    this.sink = undefined;
  }

  /** Where the socket should read next (onread.buffer). */
  buffer(): Buffer {
    if (this.state === 'body' && this.sink) {
      const into = this.sink.into();
      if (into && into.length > 0) return (this.given = into.length > this.remaining ? into.subarray(0, this.remaining) : into);
    }
    this.given = undefined;
    // Never room for more than the body: bytes past it stay in the kernel, not in this answer.
    if (this.state === 'body' || this.state === 'discard')
      return this.scratch.subarray(0, Math.max(1, Math.min(this.scratch.length, this.remaining)));
    return this.scratch.subarray(Math.min(this.scratchFilled, this.scratch.length - 1));
  }

  /** `n` bytes landed in the last buffer (onread.callback); returns whether to keep reading. */
  read(n: number): boolean {
    switch (this.state) {
      case 'head':
        return this.headBytes(n);
      case 'body':
        return this.bodyBytes(n);
      case 'discard':
        this.remaining -= n;
        if (this.remaining === 0) this.finish();
        return true;
      case 'stopped':
        return false;
      case 'idle':
        return this.fail('sent bytes no request asked for');
    }
  }

  private headBytes(n: number): boolean {
    this.scratchFilled += n;
    let end: number;
    let head: ResponseHead;
    try {
      end = headEnd(this.scratch.subarray(0, this.scratchFilled));
      if (end < 0) return this.scratchFilled >= this.headLimit ? this.fail(`sent a response head over ${this.headLimit} bytes`) : true;
      head = parseResponseHead(this.scratch.toString('latin1', 0, end));
    } catch (error) {
      return this.fail(error instanceof Http1ResponseError ? error.message : String(error));
    }
    const early = this.scratch.subarray(end + 4, this.scratchFilled);
    if (head.status < 200) {
      // An interim answer (103 Early Hints, an unasked-for 100): RFC 9110 §15.2 has clients skip it.
      if (head.status === 101) return this.fail('switched protocols, which no request here asks for');
      early.copy(this.scratch);
      this.scratchFilled = early.length;
      return early.length ? this.headBytes(0) : true;
    }
    const framing = head.framing;
    const length = framing.kind === 'length' ? framing.length : 0;
    if (framing.kind === 'length' && early.length > length) return this.fail('sent more than its Content-Length');
    const choice = this.events.head(head);
    if (this.state !== 'head') return false; // the caller ended the exchange from its callback
    if (choice === 'stop') {
      this.state = 'stopped';
      return false;
    }
    if (framing.kind === 'chunked') return this.fail('sent a chunked body, where a Content-Length was needed');
    if (framing.kind === 'until-close') return this.fail('sent no Content-Length');
    this.remaining = length - early.length;
    if (choice === 'discard') {
      this.state = 'discard';
      if (this.remaining === 0) this.finish();
      return true;
    }
    this.state = 'body';
    this.sink = choice;
    const go = early.length ? choice.took(early) : true;
    if (this.state !== 'body') return this.state === 'idle';
    if (this.remaining === 0) {
      this.finish();
      return true;
    }
    // Nowhere to put the body yet (the caller asks for it later): wait until it does.
    return go && choice.into() !== undefined;
  }

  private bodyBytes(n: number): boolean {
    const sink = this.sink;
    if (!sink) return false;
    this.remaining -= n;
    const given = this.given;
    this.given = undefined;
    const go = given ? sink.landed(n) : sink.took(this.scratch.subarray(0, n));
    if (this.state !== 'body') return this.state === 'idle';
    if (this.remaining === 0) {
      this.finish();
      return true;
    }
    return go;
  }

  /** Body bytes still to come. */
  get bodyRemaining(): number {
    return this.remaining;
  }

  private finish(): void {
    this.state = 'idle';
    this.sink = undefined;
    // The socket asks for the next read's buffer as soon as this one is handled, before the next
    // request goes out: the next head starts at the scratch's start.
    this.scratchFilled = 0;
    this.events.end();
  }

  /** Ends the exchange with a protocol error; returns false (read no more), for the socket's callback. */
  private fail(problem: string): false {
    this.state = 'stopped';
    this.sink = undefined;
    this.events.failed(new Http1ResponseError(problem));
    return false;
  }
}
