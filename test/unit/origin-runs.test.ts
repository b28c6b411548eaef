import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { contiguousRuns, lastPieceFirst, originRuns } from '../../src/peer/swarm/policy/origin-runs.js';

describe('the order of origin reads', () => {
  it("reads the blob's last piece first, on a run of its own", () => {
    assert.deepEqual(lastPieceFirst([{ first: 0, last: 9 }], 10), [
      { first: 9, last: 9 },
      { first: 0, last: 8 },
    ]);
    assert.deepEqual(
      lastPieceFirst(
        [
          { first: 0, last: 2 },
          { first: 5, last: 9 },
        ],
        10,
      ),
      [
        { first: 9, last: 9 },
        { first: 0, last: 2 },
        { first: 5, last: 8 },
      ],
    );
  });

  it('leaves runs alone when the last piece is stored, alone in its run, or the blob has one piece', () => {
    const without = [{ first: 0, last: 8 }];
    assert.deepEqual(lastPieceFirst(without, 10), without);
    const alone = [
      { first: 2, last: 4 },
      { first: 9, last: 9 },
    ];
    assert.deepEqual(lastPieceFirst(alone, 10), alone);
    assert.deepEqual(lastPieceFirst([{ first: 0, last: 0 }], 1), [{ first: 0, last: 0 }]);
    assert.deepEqual(lastPieceFirst([], 10), []);
  });

  it('cuts missing pieces into contiguous runs, one request each', () => {
    assert.deepEqual(contiguousRuns([0, 1, 2, 5, 7, 8]), [
      { first: 0, last: 2 },
      { first: 5, last: 5 },
      { first: 7, last: 8 },
    ]);
    assert.deepEqual(contiguousRuns([]), []);
  });

  it("plans a download's origin reads: contiguous runs, the blob's last piece first", () => {
    assert.deepEqual(originRuns([1, 2, 3, 6, 7], 8), [
      { first: 7, last: 7 },
      { first: 1, last: 3 },
      { first: 6, last: 6 },
    ]);
  });
});
