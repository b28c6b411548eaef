import { EstargzError } from './errors.js';
import { itemAt } from '../common/indexing.js';

/**
 * Pull-style reads of exact byte counts from a stream of Buffers, keeping only the unread
 * remainder of the current piece in memory. Returned buffers may share memory with the source.
 */
export class ByteReader {
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  private done = false;
  /** Bytes consumed so far, i.e. the stream offset of the next byte. */
  position = 0;

  constructor(private readonly source: AsyncIterator<Buffer>) {}

  static from(iterable: AsyncIterable<Buffer>): ByteReader {
    return new ByteReader(iterable[Symbol.asyncIterator]());
  }

  /** Ensures `n` bytes are buffered; false if the stream ends first. */
  private async fill(n: number): Promise<boolean> {
    while (this.pendingBytes < n) {
      if (this.done) return false;
      const next = await this.source.next();
      if (next.done) {
        this.done = true;
        return false;
      }
      if (next.value.length === 0) continue;
      this.pending.push(next.value);
      this.pendingBytes += next.value.length;
    }
    return true;
  }

  /** Exactly n bytes, or null when the stream ends cleanly before any of them. */
  async readExactOrEnd(n: number, what: string): Promise<Buffer | null> {
    if (!(await this.fill(n))) {
      if (this.pendingBytes === 0) return null;
      throw new EstargzError('TAR', `unexpected end of stream at offset ${this.position + this.pendingBytes} reading ${what}`);
    }
    return this.take(n);
  }

  async readExact(n: number, what: string): Promise<Buffer> {
    const bytes = await this.readExactOrEnd(n, what);
    if (bytes === null && n > 0) throw new EstargzError('TAR', `unexpected end of stream at offset ${this.position} reading ${what}`);
    return bytes ?? Buffer.alloc(0);
  }

  /** Yields exactly n bytes in pieces as they arrive (no extra copy). */
  async *readPieces(n: number, what: string): AsyncGenerator<Buffer> {
    let left = n;
    while (left > 0) {
      if (this.pendingBytes === 0 && !(await this.fill(1))) {
        throw new EstargzError('TAR', `unexpected end of stream at offset ${this.position} reading ${what}`);
      }
      const head = itemAt(this.pending, 0);
      const piece = head.length <= left ? head : head.subarray(0, left);
      this.consume(piece.length);
      left -= piece.length;
      yield piece;
    }
  }

  async skip(n: number, what: string): Promise<void> {
    for await (const piece of this.readPieces(n, what)) void piece;
  }

  /** Reads and discards the rest of the stream, returning how many bytes that was. */
  async drain(): Promise<number> {
    let total = this.pendingBytes;
    this.consume(this.pendingBytes);
    while (!this.done) {
      const next = await this.source.next();
      if (next.done) this.done = true;
      else {
        total += next.value.length;
        this.position += next.value.length;
      }
    }
    return total;
  }

  private take(n: number): Buffer {
    const head = itemAt(this.pending, 0);
    if (head.length >= n) {
      const out = head.subarray(0, n);
      this.consume(n);
      return out;
    }
    const out = Buffer.allocUnsafe(n);
    let copied = 0;
    while (copied < n) {
      const piece = itemAt(this.pending, 0);
      const count = Math.min(piece.length, n - copied);
      piece.copy(out, copied, 0, count);
      copied += count;
      this.consume(count);
    }
    return out;
  }

  private consume(n: number): void {
    this.position += n;
    this.pendingBytes -= n;
    while (n > 0) {
      const head = itemAt(this.pending, 0);
      if (head.length <= n) {
        this.pending.shift();
        n -= head.length;
      } else {
        this.pending[0] = head.subarray(n);
        n = 0;
      }
    }
  }
}
