import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { itemAt } from '../../src/common/indexing.js';

describe('itemAt', () => {
  it('returns the item at an index in range, from arrays, buffers and regex matches', () => {
    assert.equal(itemAt(['a', 'b'], 1), 'b');
    assert.equal(itemAt(Buffer.from([7, 0]), 1), 0);
    const match = /^(\w+)=(\w*)$/.exec('key=');
    assert.ok(match);
    assert.equal(itemAt(match, 2), '');
  });

  it('throws a RangeError naming the index and the length when nothing is there', () => {
    assert.throws(() => itemAt([], 0), { name: 'RangeError', message: 'no item at index 0 (length 0)' });
    assert.throws(() => itemAt(['a'], -1), /no item at index -1 \(length 1\)/);
    assert.throws(() => itemAt(/^(a)|(b)$/.exec('a') ?? [], 2), /no item at index 2 \(length 3\)/); // a group that took no part
  });
});
