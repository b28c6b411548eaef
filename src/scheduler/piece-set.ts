import { itemAt } from '../common/indexing.js';

/**
 * The pieces a peer holds, as a bitset: whether a parent has a piece its child lacks is a walk
 * over words, not pieces (the scheduler asks it for every pair of peers on every pass).
 */
export class PieceSet implements Iterable<number> {
  private readonly words: Uint32Array;
  private count = 0;

  constructor(readonly capacity: number) {
    this.words = new Uint32Array(Math.ceil(capacity / 32));
  }

  get size(): number {
    return this.count;
  }

  has(index: number): boolean {
    return index >= 0 && index < this.capacity && (itemAt(this.words, index >>> 5) & (1 << (index & 31))) !== 0;
  }

  /** Adds a piece; indexes outside [0, capacity) are ignored. */
  add(index: number): this {
    if (!Number.isInteger(index) || index < 0 || index >= this.capacity || this.has(index)) return this;
    const word = index >>> 5;
    this.words[word] = itemAt(this.words, word) | (1 << (index & 31));
    this.count++;
    return this;
  }

  /** Removes a piece (one that was on its way and is no longer). */
  delete(index: number): this {
    if (!this.has(index)) return this;
    const word = index >>> 5;
    this.words[word] = itemAt(this.words, word) & ~(1 << (index & 31));
    this.count--;
    return this;
  }

  /** Whether this set holds a piece that is in neither `other` nor `also`. */
  hasAnyMissingFrom(other: PieceSet, also?: PieceSet): boolean {
    const mine = this.words;
    const theirs = other.words;
    const more = also?.words;
    for (let w = 0; w < mine.length; w++) if ((itemAt(mine, w) & ~((theirs[w] ?? 0) | (more?.[w] ?? 0))) !== 0) return true;
    return false;
  }

  *[Symbol.iterator](): Iterator<number> {
    for (let w = 0; w < this.words.length; w++) {
      let bits = itemAt(this.words, w);
      while (bits !== 0) {
        const low = bits & -bits;
        yield w * 32 + (31 - Math.clz32(low));
        bits ^= low;
      }
    }
  }
}
