// What the scheduler learns of one host's links from its children's piece reports (pace.ts).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { LinkKnowledge } from '../../src/scheduler/pace.js';

const PIECE = 4 * 1024 * 1024;
/** A node's rate in these tests: bytes per ms (about 33 Gbit/s). */
const RATE = 4_000;
const PIECE_MS = PIECE / RATE;

describe('what a host delivers to its children together', () => {
  it('children served one after another read as one child at its rate, not the sum of their rates', () => {
    const links = new LinkKnowledge();
    // Eight children take a piece each in turn, each at the node's full rate.
    for (let k = 0; k < 8; k++) links.delivered(k * PIECE_MS, (k + 1) * PIECE_MS, PIECE, 16);
    assert.ok(Math.abs(links.bestDelivered - RATE) < 1, `delivered ${links.bestDelivered}, not 8 × ${RATE}`);
  });

  it('children served at once add up', () => {
    const links = new LinkKnowledge();
    // Four children take a piece each at the same time, each at the node's full rate: an upload of four times it.
    for (let k = 0; k < 4; k++) links.delivered(0, PIECE_MS, PIECE, 16);
    assert.ok(Math.abs(links.bestDelivered - 4 * RATE) < 1, `delivered ${links.bestDelivered}`);
  });

  it('measures over its last pieces only: a piece long past does not stretch the time', () => {
    const links = new LinkKnowledge();
    // One piece at a quarter of the rate, a long pause, then four at the full rate, kept four at a time.
    links.delivered(0, 4 * PIECE_MS, PIECE, 4);
    const later = 100 * PIECE_MS;
    for (let k = 0; k < 4; k++) links.delivered(later + k * PIECE_MS, later + (k + 1) * PIECE_MS, PIECE, 4);
    assert.ok(Math.abs(links.bestDelivered - RATE) < 1, `delivered ${links.bestDelivered}`);
  });

  it('a measured delivery clearly above an upload cap clears it', () => {
    const links = new LinkKnowledge();
    assert.equal(links.blameUpload(RATE / 4), true, 'nothing was delivered yet: the cap holds');
    assert.equal(links.cap, RATE / 4);
    for (let k = 0; k < 2; k++) links.delivered(k * PIECE_MS, (k + 1) * PIECE_MS, PIECE, 4);
    assert.equal(links.upCap, undefined);
  });
});

describe('blaming an upload', () => {
  it('a host whose children were last seen receiving clearly more than the rate is not capped to it', () => {
    const links = new LinkKnowledge();
    for (let k = 0; k < 2; k++) links.delivered(k * PIECE_MS, (k + 1) * PIECE_MS, PIECE, 4);
    assert.equal(links.blameUpload(RATE / 4), false);
    assert.equal(links.upCap, undefined);
    assert.equal(links.cap, undefined);
  });

  it('a host last seen delivering about the rate is capped to it', () => {
    const links = new LinkKnowledge();
    for (let k = 0; k < 2; k++) links.delivered(k * 4 * PIECE_MS, (k + 1) * 4 * PIECE_MS, PIECE, 4);
    assert.equal(links.blameUpload(RATE / 4), true);
    assert.equal(links.upCap, RATE / 4);
  });
});
