// The simulator's index of a download's candidate pieces, in the peer's own order
// (src/peer/swarm/policy/candidate-order.ts): the real peer sorts its candidates on every pump,
// which at 1000 nodes and thousands of pieces would take hours of simulated pumps; this keeps
// them sorted as they change instead. One bitset per rarity class over the pieces' random ranks,
// and one over their indexes for the head window. test/unit/swarm-policy.test.ts holds it to
// orderCandidates.

import { HEAD_WINDOW, RARITY_CLASSES } from '../src/peer/swarm/policy/candidate-order.js';

const NONE = -1;

export class CandidateBuckets {
  /** Each piece's rarity class, NONE when it is no candidate. */
  private readonly classOf: Int16Array;
  private readonly buckets: Array<Uint32Array | undefined> = [];
  private readonly bucketSize = new Int32Array(RARITY_CLASSES);
  private readonly byIndex: Uint32Array;
  private count = 0;
  /** Pieces by rank (ascending tie-break), and each piece's rank. */
  private readonly byRank: Uint32Array;
  private readonly rankOf: Uint32Array;
  private readonly words: number;

  /** `tieBreak`: the download's random rank of each piece (pieceTieBreaks). */
  constructor(tieBreak: Float64Array) {
    const n = tieBreak.length;
    this.classOf = new Int16Array(n).fill(NONE);
    this.words = Math.ceil(n / 32);
    this.byIndex = new Uint32Array(this.words);
    this.byRank = Uint32Array.from({ length: n }, (_, i) => i).sort((a, b) => (tieBreak[a] ?? 0) - (tieBreak[b] ?? 0));
    this.rankOf = new Uint32Array(n);
    this.byRank.forEach((index, rank) => (this.rankOf[index] = rank));
  }

  get size(): number {
    return this.count;
  }

  has(index: number): boolean {
    return (this.classOf[index] ?? NONE) !== NONE;
  }

  /**
   * Files a piece under its rarity class (rarityClass), or takes it out (undefined). Says whether
   * it became a candidate just now.
   */
  set(index: number, rarity: number | undefined): boolean {
    const before = this.classOf[index] ?? NONE;
    const after = rarity ?? NONE;
    if (before === after) return false;
    const rank = this.rankOf[index] ?? 0;
    if (before !== NONE) {
      flip(this.bucket(before), rank, false);
      this.bucketSize[before] = (this.bucketSize[before] ?? 0) - 1;
    } else {
      flip(this.byIndex, index, true);
      this.count++;
    }
    if (after !== NONE) {
      flip(this.bucket(after), rank, true);
      this.bucketSize[after] = (this.bucketSize[after] ?? 0) + 1;
    } else {
      flip(this.byIndex, index, false);
      this.count--;
    }
    this.classOf[index] = after;
    return before === NONE;
  }

  /**
   * Calls `visit` with the candidates in the peer's order (while a client streams the blob, the
   * head window first) until it returns false. A visit may take candidates out; one taken out
   * before its turn is still visited (its word was read already): check has().
   */
  visit(streaming: boolean, visit: (index: number) => boolean): void {
    const head: number[] = [];
    if (streaming) {
      for (let w = 0; w < this.words && head.length < HEAD_WINDOW; w++) {
        for (const index of bits(this.byIndex[w] ?? 0, w * 32)) {
          head.push(index);
          if (head.length === HEAD_WINDOW) break;
        }
      }
      for (const index of head) if (!visit(index)) return;
    }
    for (let b = 0; b < RARITY_CLASSES; b++) {
      const bucket = this.buckets[b];
      if (!bucket || this.bucketSize[b] === 0) continue;
      for (let w = 0; w < this.words; w++) {
        // The bits of one word, lowest first (inline: this loop is the simulator's hottest).
        let rest = bucket[w] ?? 0;
        while (rest !== 0) {
          const low = rest & -rest;
          rest ^= low;
          const index = this.byRank[w * 32 + (31 - Math.clz32(low))] ?? 0;
          if (head.length > 0 && head.includes(index)) continue;
          if (!visit(index)) return;
        }
      }
    }
  }

  private bucket(rarity: number): Uint32Array {
    let bucket = this.buckets[rarity];
    if (!bucket) this.buckets[rarity] = bucket = new Uint32Array(this.words);
    return bucket;
  }
}

function flip(set: Uint32Array, position: number, on: boolean): void {
  const word = position >>> 5;
  const bit = 1 << (position & 31);
  set[word] = on ? (set[word] ?? 0) | bit : (set[word] ?? 0) & ~bit;
}

/** The positions of a word's set bits, lowest first, offset by `base`. */
function* bits(word: number, base: number): Generator<number> {
  let rest = word;
  while (rest !== 0) {
    const low = rest & -rest;
    rest ^= low;
    yield base + (31 - Math.clz32(low));
  }
}
