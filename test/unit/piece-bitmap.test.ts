import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { decodeBitmap, encodeBitmap } from '../../src/peer/upload/piece-board.js';

describe('piece bitmaps (which pieces a parent holds, on the wire)', () => {
  it('decodes what it encodes, for counts on and off a byte boundary', () => {
    for (const count of [0, 1, 7, 8, 9, 63, 100]) {
      const held = new Set([...Array(count).keys()].filter((index) => (index * 7 + count) % 3 !== 0));
      const encoded = encodeBitmap(count, (index) => held.has(index));
      assert.equal(Buffer.from(encoded, 'base64').length, Math.ceil(count / 8), `bytes for ${count} pieces`);
      assert.deepEqual(decodeBitmap(encoded, count), held, `${count} pieces`);
    }
  });

  it('puts piece i at bit i % 8 of byte i / 8, and ignores bits past the count', () => {
    assert.equal(
      encodeBitmap(10, (index) => index === 0 || index === 9),
      Buffer.from([0b0000_0001, 0b0000_0010]).toString('base64'),
    );
    assert.deepEqual(decodeBitmap(Buffer.from([0xff]).toString('base64'), 3), new Set([0, 1, 2]));
    assert.deepEqual(decodeBitmap('', 16), new Set()); // a short bitmap holds nothing past its end
  });
});
