/**
 * Wakes long-polling children when this peer stores a piece of a task they follow, so piece
 * availability spreads peer to peer without going through the scheduler.
 */
export class PieceBoard {
  private readonly waiters = new Map<string, Set<() => void>>();

  notify(taskId: string): void {
    const set = this.waiters.get(taskId);
    if (!set) return;
    this.waiters.delete(taskId);
    for (const wake of set) wake();
  }

  /** Resolves on the next change of the task, or after `timeoutMs`. */
  wait(taskId: string, timeoutMs: number, signal?: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      let set = this.waiters.get(taskId);
      if (!set) this.waiters.set(taskId, (set = new Set()));
      const done = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', done);
        set.delete(done);
        resolve();
      };
      const timer = setTimeout(done, timeoutMs);
      signal?.addEventListener('abort', done);
      set.add(done);
    });
  }
}

/** Encodes which pieces are held as a bitmap (piece i is bit i % 8 of byte i / 8), base64. */
export function encodeBitmap(pieceCount: number, has: (index: number) => boolean): string {
  const bytes = Buffer.alloc(Math.ceil(pieceCount / 8));
  for (let byte = 0; byte < bytes.length; byte++) {
    let bits = 0;
    for (let bit = 0; bit < 8 && byte * 8 + bit < pieceCount; bit++) if (has(byte * 8 + bit)) bits |= 1 << bit;
    bytes[byte] = bits;
  }
  return bytes.toString('base64');
}

export function decodeBitmap(encoded: string, pieceCount: number): Set<number> {
  const bytes = Buffer.from(encoded, 'base64');
  const out = new Set<number>();
  for (let index = 0; index < pieceCount && index >> 3 < bytes.length; index++)
    if (bytes.readUInt8(index >> 3) & (1 << (index & 7))) out.add(index);
  return out;
}
