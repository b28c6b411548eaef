import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { BUSY_BACKOFF_MAX_MS, BUSY_BACKOFF_MIN_MS, busyBackoffMs } from '../../src/peer/swarm/policy/busy-backoff.js';

describe('how long a busy parent is left alone', () => {
  const MiB = 2 ** 20;

  it("waits about one of that parent's piece times", () => {
    // 32 MiB at ~3 GB/s (25 Gbit/s): ~11 ms a piece.
    const rate = 3_000_000; // bytes per millisecond
    assert.equal(busyBackoffMs(32 * MiB, rate), (32 * MiB) / rate);
  });

  it('keeps the 250 ms bound on slow links, where a piece takes seconds', () => {
    assert.equal(busyBackoffMs(4 * MiB, 1_250), BUSY_BACKOFF_MAX_MS); // 10 Mbit/s: 3.4 s a piece
  });

  it('never retries sooner than the floor', () => {
    assert.equal(busyBackoffMs(64 * 1024, 100_000_000), BUSY_BACKOFF_MIN_MS);
  });

  it("while the parent's pace is unknown, starts at the floor and doubles with each 429 in a row up to the bound", () => {
    assert.equal(busyBackoffMs(4 * MiB, 0), BUSY_BACKOFF_MIN_MS);
    assert.equal(busyBackoffMs(0, 0, 2), 2 * BUSY_BACKOFF_MIN_MS);
    assert.equal(busyBackoffMs(4 * MiB, Number.NaN, 3), 4 * BUSY_BACKOFF_MIN_MS);
    assert.equal(busyBackoffMs(4 * MiB, 0, 6), BUSY_BACKOFF_MAX_MS);
    assert.equal(busyBackoffMs(4 * MiB, 0, 1e9), BUSY_BACKOFF_MAX_MS);
  });
});
