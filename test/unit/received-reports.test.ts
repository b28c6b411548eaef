// Received reports: what a download says it has received while pieces arrive (the peer's side),
// and how the scheduler reads rates from them (pace.ts).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { GrowingPiece } from '../../src/peer/growing-piece.js';
import { ReceivedBytes as PeerReceived } from '../../src/peer/swarm/received-bytes.js';
import { PieceProgress, ReceivedBytes } from '../../src/scheduler/pace.js';

describe("Received reports: the peer's running total", () => {
  it('counts pieces on their way, then the bytes of ended ones, given up or stored, for good', () => {
    const received = new PeerReceived();
    assert.equal(received.report(), undefined, 'nothing on its way: nothing to say');
    const first = new GrowingPiece(3, Buffer.alloc(1_000), () => undefined);
    const second = new GrowingPiece(7, Buffer.alloc(1_000), () => undefined);
    received.began(first);
    received.began(second);
    first.advance(400);
    second.advance(100);
    assert.deepEqual(received.report(), {
      bytes: 500,
      pieces: [
        { index: 3, bytes: 400 },
        { index: 7, bytes: 100 },
      ],
    });
    first.advance(1_000);
    first.end();
    second.advance(250);
    second.end(); // given up: its 250 bytes took the link all the same
    const again = new GrowingPiece(7, Buffer.alloc(1_000), () => undefined);
    received.began(again);
    again.advance(50);
    assert.deepEqual(received.report(), { bytes: 1_300, pieces: [{ index: 7, bytes: 50 }] });
    again.end();
    assert.equal(received.report(), undefined);
  });
});

describe("Received reports: the scheduler's rates", () => {
  it('measures over its latest reports spanning a second, none before the given start', () => {
    const totals = new ReceivedBytes();
    for (let at = 0; at <= 2_000; at += 500) totals.said(at, at < 1_000 ? at * 2 : 2_000 + (at - 1_000) / 2);
    // 2 bytes per ms until 1 s, then half a byte: the latest second says the latter.
    assert.deepEqual(totals.rateSince(0, 2_000), { since: 1_000, until: 2_000, rate: 0.5 });
    assert.equal(totals.rateSince(1_200, 2_000), undefined, 'from 1.2 s on, the reports span less than a second');
    assert.equal(totals.rateSince(0, 3_600), undefined, 'a newest report 1.6 s old says nothing of now');
  });

  it('ignores a total that goes back, or a report no later than the last', () => {
    const totals = new ReceivedBytes();
    totals.said(0, 0);
    totals.said(500, 500);
    totals.said(700, 100); // went back: a lie or a restart, not a rate
    totals.said(500, 9_000); // not later
    totals.said(1_000, 1_000);
    assert.deepEqual(totals.rateSince(0, 1_000), { since: 0, until: 1_000, rate: 1 });
  });

  it("reads a piece's bytes at a moment between its reports, from zero at its first byte", () => {
    const progress = new PieceProgress();
    progress.said(4, 1_500, 1_000);
    progress.said(4, 2_000, 3_000);
    assert.equal(progress.bytesAt(4, 1_000, 1_250), 500, 'halfway from its first byte to its first report');
    assert.equal(progress.bytesAt(4, 1_000, 1_750), 2_000);
    assert.equal(progress.bytesAt(4, 1_000, 2_500), 3_000, 'after its last report: what it had then, at least');
    assert.equal(progress.bytesAt(4, 1_000, 900), 0, 'before its first byte');
    progress.forget(4);
    assert.equal(progress.latest(4), undefined);
  });
});
