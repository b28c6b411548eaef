import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { CandidateBuckets } from '../../sim/candidate-buckets.js';
import { seededRandom } from '../../bench/lib/random.js';
import { HEAD_WINDOW, orderCandidates, pieceTieBreaks, rarityClass, type Candidate } from '../../src/peer/swarm/policy/candidate-order.js';
import {
  bestParentFor,
  parentIsFree,
  parentPieceLimit,
  stillUploading,
  type ParentChoice,
  type ParentView,
} from '../../src/peer/swarm/policy/parent-choice.js';
import { ParentPace } from '../../src/peer/swarm/policy/parent-pace.js';
import { BUSY_BACKOFF_MAX_MS, BUSY_BACKOFF_MIN_MS } from '../../src/peer/swarm/policy/busy-backoff.js';
import { ORIGIN_AFTER_STALLS, pieceCheckIntervalMs, stallVerdict } from '../../src/peer/swarm/policy/stall.js';

const ranks = (...order: number[]) => {
  // tieBreak giving the listed pieces ascending ranks
  const rank = new Map(order.map((index, position) => [index, position]));
  return (index: number) => rank.get(index) ?? 1e9;
};

describe('swarm policy: which piece first', () => {
  it('asks for pieces some node offers before pieces only seeds offer, however rare', () => {
    const candidates: Candidate[] = [
      { index: 0, holders: 1, nodeHolders: 0 }, // one seed
      { index: 1, holders: 5, nodeHolders: 4 },
    ];
    assert.deepEqual(orderCandidates(candidates, ranks(0, 1), false), [1, 0]);
  });

  it("asks for the rarest first, then by the download's random rank", () => {
    const candidates: Candidate[] = [
      { index: 0, holders: 3, nodeHolders: 3 },
      { index: 1, holders: 1, nodeHolders: 1 },
      { index: 2, holders: 3, nodeHolders: 2 },
      { index: 3, holders: 3, nodeHolders: 1 },
    ];
    assert.deepEqual(orderCandidates(candidates, ranks(3, 0, 2), false), [1, 3, 0, 2]);
  });

  it('puts the head window first while a client streams the blob, and only that many', () => {
    const candidates: Candidate[] = [5, 4, 3, 2, 1].map((index) => ({ index, holders: index, nodeHolders: index }));
    const order = orderCandidates(candidates, ranks(), true);
    assert.equal(HEAD_WINDOW, 2);
    assert.deepEqual(order.slice(0, HEAD_WINDOW), [1, 2]);
    assert.deepEqual(order.slice(HEAD_WINDOW), [3, 4, 5]); // the rest by rarity again
  });

  it("asks for a lazy reader's awaited pieces first, those a parent carries before those it would fetch, each in index order", () => {
    const candidates: Candidate[] = [
      { index: 6, holders: 1, nodeHolders: 1 }, // only background readers want it
      { index: 3, holders: 1, nodeHolders: 1, awaited: true },
      { index: 2, holders: 1, nodeHolders: 1, awaited: true, carried: true },
      { index: 0, holders: 1, nodeHolders: 1, awaited: true },
      { index: 1, holders: 1, nodeHolders: 0, awaited: true, carried: true }, // seed-only, but on its way there
      { index: 5, holders: 9, nodeHolders: 9 },
    ];
    // Whatever the download's random rank: every node of a chain asks in the same order.
    for (const tieBreak of [ranks(3, 0, 2, 1, 5, 6), ranks(6, 5, 0, 1, 2, 3)])
      assert.deepEqual(orderCandidates(candidates, tieBreak, false), [1, 2, 0, 3, 6, 5]);
    // A client streaming the blob keeps its head window ahead of them.
    assert.deepEqual(orderCandidates(candidates, ranks(), true), [0, 1, 2, 3, 6, 5]);
  });

  it("ranks holder counts past the scheduler's parent limit alike", () => {
    assert.equal(rarityClass(70, 70), rarityClass(63, 63));
    assert.ok(rarityClass(63, 63) < rarityClass(1, 0));
  });

  it('gives each download its own fixed random rank per piece', () => {
    const random = seededRandom(7);
    const a = pieceTieBreaks(100, random);
    const b = pieceTieBreaks(100, random);
    assert.equal(a.length, 100);
    assert.notDeepEqual([...a], [...b]);
  });

  it("is what the simulator's candidate buckets yield, for any holdings", () => {
    const random = seededRandom(42);
    for (let round = 0; round < 50; round++) {
      const pieceCount = 1 + Math.floor(random() * 200);
      const tieBreak = pieceTieBreaks(pieceCount, random);
      const buckets = new CandidateBuckets(tieBreak);
      const candidates = new Map<number, Candidate>();
      // A history of changes, as a download's pieces come and go.
      for (let step = 0; step < 3 * pieceCount; step++) {
        const index = Math.floor(random() * pieceCount);
        if (random() < 0.25) {
          candidates.delete(index);
          buckets.set(index, undefined);
        } else {
          const holders = 1 + Math.floor(random() * 8);
          const nodeHolders = Math.floor(random() * (holders + 1));
          candidates.set(index, { index, holders, nodeHolders });
          buckets.set(index, rarityClass(holders, nodeHolders));
        }
      }
      assert.equal(buckets.size, candidates.size);
      for (const streaming of [false, true]) {
        const visited: number[] = [];
        buckets.visit(streaming, (index) => visited.push(index) > 0);
        assert.deepEqual(
          visited,
          orderCandidates([...candidates.values()], (index) => tieBreak[index] ?? 0, streaming),
          `round ${round}, streaming ${streaming}`,
        );
      }
    }
  });

  it("stops the simulator's visit when asked to", () => {
    const buckets = new CandidateBuckets(Float64Array.from([0.3, 0.2, 0.1]));
    for (const index of [0, 1, 2]) buckets.set(index, rarityClass(1, 1));
    const visited: number[] = [];
    buckets.visit(false, (index) => visited.push(index) < 2);
    assert.deepEqual(visited, [2, 1]);
  });
});

class Parent implements ParentView {
  inflight = 0;
  rate = 0;
  busyUntil = 0;
  uploading = 0;
  constructor(
    readonly name: string,
    readonly seed: boolean,
    readonly whole: Set<number>,
    readonly growing = new Set<number>(),
    readonly piecesAtOnce: number | undefined = undefined,
  ) {}
  offers(index: number): boolean {
    return this.whole.has(index) || this.growing.has(index);
  }
  holdsWhole(index: number): boolean {
    return this.whole.has(index);
  }
}

const choice = (parents: Parent[], now = 1_000): ParentChoice<Parent> => ({
  now,
  perParent: 3,
  hasNodeParents: parents.some((p) => !p.seed),
  uploading: (p) => p.uploading,
});

describe('swarm policy: which parent', () => {
  it('prefers a parent holding the piece whole to one still receiving it, even a seed', () => {
    const relaying = new Parent('node', false, new Set(), new Set([0]));
    const seed = new Parent('seed', true, new Set([0]));
    assert.equal(bestParentFor(0, [relaying, seed], choice([relaying, seed]))?.name, 'seed');
  });

  it('prefers a node to a seed, then the least busy, then the fastest', () => {
    const seed = new Parent('seed', true, new Set([0]));
    const busy = new Parent('busy', false, new Set([0]));
    busy.inflight = 2;
    const slow = new Parent('slow', false, new Set([0]));
    slow.inflight = 1;
    slow.rate = 10;
    const fast = new Parent('fast', false, new Set([0]));
    fast.inflight = 1;
    fast.rate = 20;
    const all = [seed, busy, slow, fast];
    assert.equal(bestParentFor(0, all, choice(all))?.name, 'fast');
    assert.equal(bestParentFor(0, all, choice(all), fast)?.name, 'slow');
    assert.equal(bestParentFor(0, [seed, busy], choice([seed, busy]))?.name, 'busy');
  });

  it('skips parents that do not offer the piece, are backing off, or are at their limit', () => {
    const none = new Parent('none', false, new Set([1]));
    const backingOff = new Parent('backing off', false, new Set([0]));
    backingOff.busyUntil = 1_001;
    const full = new Parent('full', false, new Set([0]));
    full.uploading = 3;
    const all = [none, backingOff, full];
    assert.equal(bestParentFor(0, all, choice(all)), undefined);
    assert.equal(bestParentFor(0, all, choice(all, 1_001))?.name, 'backing off');
  });

  it("asks a seed for one piece at a time while node parents exist, else perParent; the scheduler's cap wins", () => {
    const seed = new Parent('seed', true, new Set([0]));
    assert.equal(parentPieceLimit(seed, 3, true), 1);
    assert.equal(parentPieceLimit(seed, 3, false), 3);
    assert.equal(parentPieceLimit(new Parent('chain', false, new Set(), new Set(), 1), 3, true), 1);
    assert.equal(parentPieceLimit(new Parent('cap 0', false, new Set(), new Set(), 0), 3, true), 3);
    seed.uploading = 1;
    const node = new Parent('node', false, new Set([0]));
    assert.equal(parentIsFree(seed, choice([seed, node])), false);
    assert.equal(parentIsFree(seed, choice([seed])), true);
  });

  it('frees a parent for the next piece once all but the held-back last byte is in', () => {
    assert.equal(stillUploading(undefined, 100), true); // not begun
    assert.equal(stillUploading(0, 100), true);
    assert.equal(stillUploading(98, 100), true);
    assert.equal(stillUploading(99, 100), false);
    assert.equal(stillUploading(100, 100), false);
    assert.equal(stillUploading(undefined, 1), true); // a one-byte piece not begun still counts
  });
});

describe("swarm policy: a parent's pace", () => {
  it("starts at the first piece's rate and follows later pieces as a moving average", () => {
    const pace = new ParentPace();
    pace.pieceServed(1_000, 10);
    assert.equal(pace.rate, 100);
    pace.pieceServed(1_000, 5); // 200 B/ms
    assert.equal(pace.rate, 0.7 * 100 + 0.3 * 200);
    pace.pieceServed(1_000, 0); // no time at all counts as 1 ms
    assert.ok(Number.isFinite(pace.rate));
  });

  it("waits after a 429 about one of the last piece's times from that parent", () => {
    const pace = new ParentPace();
    pace.pieceServed(4_000_000, 20); // 200 kB/ms
    assert.equal(pace.answeredBusy(), 20);
    assert.equal(pace.answeredBusy(), 20, 'a measured pace sets the wait, however many 429s');
  });

  it('while nothing was served yet, waits twice as long after each 429 in a row, from the floor to the bound', () => {
    const pace = new ParentPace();
    const waits = Array.from({ length: 7 }, () => pace.answeredBusy());
    assert.deepEqual(waits, [BUSY_BACKOFF_MIN_MS, 20, 40, 80, 160, BUSY_BACKOFF_MAX_MS, BUSY_BACKOFF_MAX_MS]);
  });
});

describe('swarm policy: when a stalled download asks for help', () => {
  const stallMs = 10_000;
  it('waits while pieces are on their way, however long nothing was stored', () => {
    assert.equal(stallVerdict(100 * stallMs, stallMs, 1), 'wait');
  });

  it('asks for new parents after stallMs and reads the origin after ORIGIN_AFTER_STALLS × stallMs, or after stallMs with no scheduler to ask', () => {
    assert.equal(ORIGIN_AFTER_STALLS, 6);
    assert.equal(stallVerdict(stallMs, stallMs, 0), 'wait');
    assert.equal(stallVerdict(stallMs + 1, stallMs, 0), 'reschedule');
    assert.equal(stallVerdict(2 * stallMs + 1, stallMs, 0), 'reschedule'); // not at 2× (the rule before 5a46877)
    assert.equal(stallVerdict(6 * stallMs, stallMs, 0), 'reschedule');
    assert.equal(stallVerdict(6 * stallMs + 1, stallMs, 0), 'origin');
    // No scheduler to ask for parents: the origin as soon as the stall is seen.
    assert.equal(stallVerdict(stallMs, stallMs, 0, false), 'wait');
    assert.equal(stallVerdict(stallMs + 1, stallMs, 0, false), 'origin');
    assert.equal(stallVerdict(100 * stallMs, stallMs, 1, false), 'wait');
  });

  it('checks a piece on its way for new bytes at least every second, four times per piece timeout', () => {
    assert.equal(pieceCheckIntervalMs(15_000), 1_000);
    assert.equal(pieceCheckIntervalMs(400), 100);
  });
});
