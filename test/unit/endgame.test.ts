import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ENDGAME_AFTER_MS, ENDGAME_SLOWER, wantsSecondParent } from '../../src/peer/swarm/policy/endgame.js';

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

  it('does not ask a parent whose rate is unknown (nothing served yet)', () => {
    assert.equal(wantsSecondParent({ receivedBytes: 0, elapsedMs: 10_000 }, 0), false);
    assert.equal(wantsSecondParent({ receivedBytes: 0, elapsedMs: 10_000 }, Number.NaN), false);
  });
});
