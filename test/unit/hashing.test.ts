import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { describe, it } from 'node:test';
import { crc32c, createStreamingHash, offThreadHashing, sha256Hex } from '../../src/common/hashing.js';
import { checkMatches, pieceCheck } from '../../src/storage/piece-check.js';

describe('hashing off the JavaScript thread (native/digest)', () => {
  it('is built (npm ci builds it; without it the peer falls back to hashing on its main thread)', () => {
    assert.ok(offThreadHashing());
  });

  it('gives the same SHA-256 and SHA-512 as node:crypto, over updates of any size and offset', async () => {
    const data = randomBytes(3 * 1024 * 1024 + 17);
    for (const algorithm of ['sha256', 'sha512']) {
      const hash = createStreamingHash(algorithm);
      // Updates queued without waiting run in call order, and subarrays hash only their own bytes.
      const cuts = [0, 1, 4096, 1_000_003, 2_500_000, data.length];
      await Promise.all(cuts.slice(1).map((end, i) => hash.update(data.subarray(cuts[i], end))));
      assert.equal(hash.hex(), createHash(algorithm).update(data).digest('hex'), algorithm);
    }
    assert.equal(await sha256Hex(data), createHash('sha256').update(data).digest('hex'));
    assert.equal(await sha256Hex(new Uint8Array(0)), createHash('sha256').digest('hex'));
  });

  it('computes CRC-32C (Castagnoli) check values', async () => {
    assert.equal(await crc32c(Buffer.from('123456789')), 0xe3069283);
    assert.equal(await crc32c(new Uint8Array(32)), 0x8a9136aa);
    assert.equal(await crc32c(Buffer.alloc(0)), 0);
    // Unaligned starts and tails that are not a multiple of 8 bytes.
    const text = Buffer.from('x123456789');
    assert.equal(await crc32c(text.subarray(1)), 0xe3069283);
  });

  it('refuses what it cannot hash, by name', async () => {
    assert.throws(() => createStreamingHash('md-nothing'), /unsupported digest algorithm: md-nothing/);
    await assert.rejects(async () => sha256Hex('text' as unknown as Uint8Array), /expected a Buffer or Uint8Array/);
    const hash = createStreamingHash('sha256');
    await hash.update(Buffer.from('a'));
    hash.hex();
    await assert.rejects(hash.update(Buffer.from('b')), /update\(\) after hex\(\)/);
  });

  it('piece checks: a CRC-32C outside a swarm, a SHA-256 in one, each recognizing its own bytes only', async () => {
    const piece = randomBytes(4 * 1024 * 1024);
    const crc = await pieceCheck('crc', piece);
    assert.match(crc, /^crc32c:[0-9a-f]{8}$/);
    assert.equal(await pieceCheck('sha256', piece), createHash('sha256').update(piece).digest('hex'));
    const torn = Buffer.from(piece);
    torn.writeUInt8(torn.readUInt8(123_456) ^ 1, 123_456);
    for (const check of [crc, await pieceCheck('sha256', piece)]) {
      assert.ok(await checkMatches(check, piece));
      assert.ok(!(await checkMatches(check, torn)), `${check} must not match a torn piece`);
    }
  });
});
