import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  chainParentsServe,
  dropsWithRetiredParent,
  ENDGAME_AFTER_MS,
  ENDGAME_SLOWER,
  RETIRED_SLOWER,
  wantsSecondParent,
} from '../../src/peer/swarm/policy/endgame.js';

describe('endgame: when a piece on its way gets a second parent', () => {
  const fastParent = 1_000; // bytes per millisecond (~8 Mbit/s)

  it('asks a second parent for a piece arriving far slower than that parent serves', () => {
    const straggler = { receivedBytes: 100_000, elapsedMs: 2_000 }; // 50 B/ms
    assert.equal(wantsSecondParent(straggler, fastParent), true);
  });

  it('leaves alone a piece arriving at a comparable rate', () => {
    const steady = { receivedBytes: 1_000_000, elapsedMs: 2_000 }; // 500 B/ms: only 2× slower
    assert.equal(wantsSecondParent(steady, fastParent), false);
    const atTheLimit = { receivedBytes: (fastParent / ENDGAME_SLOWER) * 2_000, elapsedMs: 2_000 };
    assert.equal(wantsSecondParent(atTheLimit, fastParent), false);
  });

  it('gives a piece ENDGAME_AFTER_MS before calling it a straggler', () => {
    assert.equal(wantsSecondParent({ receivedBytes: 0, elapsedMs: ENDGAME_AFTER_MS - 1 }, fastParent), false);
    assert.equal(wantsSecondParent({ receivedBytes: 0, elapsedMs: ENDGAME_AFTER_MS }, fastParent), true);
  });

  it('does not ask a parent whose rate is unknown (nothing served yet) while no parent has served this peer', () => {
    assert.equal(wantsSecondParent({ receivedBytes: 0, elapsedMs: 10_000 }, 0), false);
    assert.equal(wantsSecondParent({ receivedBytes: 0, elapsedMs: 10_000 }, Number.NaN), false);
    assert.equal(wantsSecondParent({ receivedBytes: 0, elapsedMs: 10_000 }, 0, 0), false);
  });

  it('expects a parent that served nothing yet to serve as fast as the fastest parent did', () => {
    // The last piece, asked of a 2 Mbit/s node long ago, at 40 B/ms; the new parent holds the whole blob.
    const hanging = { receivedBytes: 2_000_000, elapsedMs: 50_000 };
    assert.equal(wantsSecondParent(hanging, 0, 2_000), true);
    assert.equal(wantsSecondParent(hanging, 0, 4 * 40), false, 'not when it comes no slower than ENDGAME_SLOWER times what any parent did');
    assert.equal(wantsSecondParent(hanging, 100, 2_000), false, 'a measured rate counts over the fastest one seen');
  });
});

describe('a piece on its way from a parent the scheduler replaced', () => {
  const servedBefore = 1_176; // bytes per millisecond: 4 MiB pieces in 3.57 s (10 Mbit/s)
  const length = 4 * 1024 * 1024;

  it('is given up when the parent slowed down under it', () => {
    // A node cut to a tenth of its rate 0.4 s into a piece, moved off 5.25 s later: 1.1 MB in 5.65 s.
    const slowed = { receivedBytes: 0.4 * servedBefore * 1_000 + 5.25 * (servedBefore / 10) * 1_000, elapsedMs: 5_650, length };
    assert.equal(dropsWithRetiredParent(slowed, servedBefore), true);
    // Cut to a fifth 1 s into the piece, moved off 5 s later: only 3 times slower on average, but
    // the rest (1.8 MB at that pace, 4.7 s) takes longer than the whole piece anew (3.6 s).
    const fifth = { receivedBytes: 1 * servedBefore * 1_000 + 5 * (servedBefore / 5) * 1_000, elapsedMs: 6_000, length };
    assert.equal(dropsWithRetiredParent(fifth, servedBefore), true);
  });

  it('finishes when it arrives at the pace the parent served before (a chain split, not a slowdown)', () => {
    assert.equal(dropsWithRetiredParent({ receivedBytes: 2_000 * servedBefore, elapsedMs: 2_000, length }, servedBefore), false);
    // Half done at two thirds of the usual pace: the rest takes less than the piece anew.
    assert.equal(
      dropsWithRetiredParent({ receivedBytes: length / 2, elapsedMs: (1.5 * length) / 2 / servedBefore, length }, servedBefore),
      false,
    );
  });

  it('finishes when it comes less than RETIRED_SLOWER times slower, though the rest would take longer than a fresh piece', () => {
    // A fifth of the way in at 0.7 of the usual pace (a busy machine's dip): the rest would take 1.14 piece times.
    const dip = { receivedBytes: length / 5, elapsedMs: length / 5 / (0.7 * servedBefore), length };
    assert.equal(dropsWithRetiredParent(dip, servedBefore), false);
    assert.equal(dropsWithRetiredParent({ ...dip, elapsedMs: (dip.elapsedMs * 0.7 * RETIRED_SLOWER) / 0.99 }, servedBefore), true);
  });

  it('finishes when nearly done, however slowly it came', () => {
    assert.equal(dropsWithRetiredParent({ receivedBytes: length - 1_000, elapsedMs: 30_000, length }, servedBefore), false);
  });

  it('finishes when nothing says it is late: just begun, or a parent that served nothing before and no parent that offers the piece', () => {
    assert.equal(dropsWithRetiredParent({ receivedBytes: 0, elapsedMs: ENDGAME_AFTER_MS - 1, length }, servedBefore), false);
    assert.equal(dropsWithRetiredParent({ receivedBytes: 0, elapsedMs: 30_000, length }, 0), false);
    assert.equal(dropsWithRetiredParent({ receivedBytes: 0, elapsedMs: 30_000, length }, 0, 0), false);
  });

  it('judges a piece from a parent that served nothing before by what the parents offering it now serve', () => {
    // A relay of a 2 Mbit/s node's trickle, 10 s in, while the new parent serves at 10 Mbit/s: the
    // rest (1.7 MB at 250 bytes/ms, 6.8 s) takes longer than the piece anew (3.4 s).
    const trickle = { receivedBytes: 10_000 * 250, elapsedMs: 10_000, length };
    const newParent = 1_250; // bytes per ms: 10 Mbit/s
    assert.equal(dropsWithRetiredParent(trickle, 0, newParent), true);
    // The same piece coming at the new parent's pace finishes.
    assert.equal(dropsWithRetiredParent({ receivedBytes: 2_000 * newParent, elapsedMs: 2_000, length }, 0, newParent), false);
    // What the retired parent served before, when it did, is the measure, not the new parents'.
    assert.equal(dropsWithRetiredParent(trickle, 300, newParent), false);
  });

  it('counts only chain parents (one piece at a time) that offer the piece for that measure', () => {
    const parent = (piecesAtOnce: number | undefined, rate: number) => ({ piecesAtOnce, rate, offers: (index: number) => index === 3 });
    assert.equal(chainParentsServe([parent(1, 500), parent(1, 800)], 3), 800, 'the fastest chain parent offering it');
    assert.equal(chainParentsServe([parent(1, 500)], 4), 0, 'not offered');
    assert.equal(chainParentsServe([parent(3, 900)], 3), 0, 'a mesh parent: several pieces at once');
    assert.equal(chainParentsServe([parent(undefined, 900)], 3), 0, 'no cap set');
  });
});
