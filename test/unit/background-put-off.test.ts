import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  BACKGROUND_QUIET_MS,
  putsBackgroundOff,
  SWARM_READING_HOLD_MAX_MS,
  waitsForSwarm,
} from '../../src/peer/swarm/policy/background-put-off.js';

describe('a seed putting background pieces off (policy)', () => {
  const background = { wholeBlob: false, background: true };
  it('puts a background piece off while a read a workload waits for is recent, and fetches it once they quieten', () => {
    assert.equal(putsBackgroundOff(background, 10_000, 10_000 + BACKGROUND_QUIET_MS - 1), true);
    assert.equal(putsBackgroundOff(background, 10_000, 10_000 + BACKGROUND_QUIET_MS), false);
    assert.equal(putsBackgroundOff(background, 0, 50_000), false, 'no read on demand yet');
  });
  it('never puts off a piece a workload waits for, nor one of a whole download', () => {
    assert.equal(putsBackgroundOff({ wholeBlob: false, background: false }, 10_000, 10_001), false);
    assert.equal(putsBackgroundOff({ wholeBlob: true, background: true }, 10_000, 10_001), false);
    assert.equal(putsBackgroundOff({ wholeBlob: false, background: false }, 0, 50_000, 49_000), false);
  });
  it("puts a background piece off while the scheduler says the swarm reads on demand, though the seed's children are quiet", () => {
    assert.equal(putsBackgroundOff(background, 0, 50_000, 45_000), true);
    assert.equal(putsBackgroundOff(background, 0, 50_000, undefined), false, 'the scheduler said the reads ended');
  });
});

describe('background pieces waiting for the swarm (policy)', () => {
  it('wait while the scheduler says the swarm reads on demand, for a bounded time', () => {
    assert.equal(waitsForSwarm(undefined, 10_000), false);
    assert.equal(waitsForSwarm(10_000, 10_000 + SWARM_READING_HOLD_MAX_MS - 1), true);
    assert.equal(waitsForSwarm(10_000, 10_000 + SWARM_READING_HOLD_MAX_MS), false, 'no notice that the reads ended: not for ever');
  });
});
