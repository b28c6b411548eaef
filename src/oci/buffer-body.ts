// A response body read into the caller's buffers rather than handed out as chunks. The direct
// reader (direct-get.ts) has the socket read straight into those buffers; a body from undici is
// copied into them chunk by chunk, so callers need not care which one they got.

/** Called after each read with how many bytes of the fill are in; a promise holds further reads. */
export type OnFill = (filled: number) => void | Promise<void>;

export interface BufferBody {
  /**
   * Reads into `target[offset, offset + length)` until it is full or the body ends, and resolves
   * with how many bytes arrived (fewer than `length` only at the end of the body). Rejects if the
   * body is cut short or destroyed. One fill at a time.
   */
  fill(target: Buffer, offset: number, length: number, onFill?: OnFill): Promise<number>;
  /** The rest of the body as text (its first `limit` bytes). */
  text(limit?: number): Promise<string>;
  /** Drops the connection; a fill under way fails with `error`. */
  destroy(error?: Error): void;
}

const TEXT_LIMIT = 64 * 1024;

/** Reads the rest of `body` as UTF-8, keeping its first `limit` bytes. */
export async function bodyText(body: BufferBody, limit = TEXT_LIMIT): Promise<string> {
  const kept = Buffer.allocUnsafe(limit);
  const filled = await body.fill(kept, 0, limit);
  if (filled === limit) {
    const rest = Buffer.allocUnsafe(16 * 1024);
    while ((await body.fill(rest, 0, rest.length)) === rest.length);
  }
  return kept.toString('utf8', 0, filled);
}

/** Wraps a chunked body (undici's) as a BufferBody: each chunk is copied into the caller's buffer. */
export function chunkedBufferBody(body: AsyncIterable<Buffer> & { destroy(error?: Error): unknown }): BufferBody {
  const chunks = body[Symbol.asyncIterator]();
  let current: Buffer | undefined;
  let done = false;
  const self: BufferBody = {
    async fill(target, offset, length, onFill) {
      let filled = 0;
      while (filled < length) {
        if (!current?.length) {
          if (done) break;
          const next = await chunks.next();
          if (next.done) {
            done = true;
            break;
          }
          current = next.value;
          continue;
        }
        const n = current.copy(target, offset + filled, 0, Math.min(length - filled, current.length));
        current = current.subarray(n);
        filled += n;
        await onFill?.(filled);
      }
      return filled;
    },
    text: (limit) => bodyText(self, limit),
    destroy(error) {
      done = true;
      body.destroy(error);
    },
  };
  return self;
}
