import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { PieceBufferPool } from '../../src/peer/piece-buffers.js';

describe('piece buffer pool', () => {
  it('hands a buffer out again only after its last holder let go', () => {
    const pool = new PieceBufferPool();
    const first = pool.take(1024);
    assert.equal(pool.holders(first), 1);
    pool.hold(first); // a relay
    pool.release(first); // the fetch ends
    const second = pool.take(1024);
    assert.notEqual(second, first, 'still held by the relay: not reused');
    pool.release(first); // the relay's write is done
    assert.equal(pool.holders(first), 0);
    assert.equal(pool.take(1024), first, 'reused once idle');
    assert.equal(pool.reused, 1);
    assert.notEqual(pool.take(2048), first, 'only for the same length');
  });

  it('ignores buffers it did not hand out, and extra releases of an idle one', () => {
    const pool = new PieceBufferPool();
    const foreign = Buffer.alloc(1024);
    pool.hold(foreign);
    pool.release(foreign);
    assert.notEqual(pool.take(1024), foreign);
    const own = pool.take(512);
    pool.release(own);
    pool.release(own); // a second release of an idle buffer must not list it twice
    const a = pool.take(512);
    const b = pool.take(512);
    assert.equal(a, own);
    assert.notEqual(b, own);
  });

  it('keeps at most 16 idle buffers per length', () => {
    const pool = new PieceBufferPool();
    const taken = Array.from({ length: 20 }, () => pool.take(64));
    for (const buffer of taken) pool.release(buffer);
    const again = Array.from({ length: 20 }, () => pool.take(64));
    assert.equal(again.filter((buffer) => taken.includes(buffer)).length, 16);
  });
});

describe('piece buffer pool when the peer goes quiet', () => {
  it('drops its idle buffers once none was taken for a while', async () => {
    const pool = new PieceBufferPool(50);
    const buffers = [pool.take(64), pool.take(64)];
    for (const buffer of buffers) pool.release(buffer);
    assert.equal(pool.idleCount, 2);
    await new Promise((resolve) => setTimeout(resolve, 160));
    assert.equal(pool.idleCount, 0);
    assert.ok(!buffers.includes(pool.take(64)), 'a new buffer after the trim');
  });
});
