import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { WantedPieces } from '../../src/peer/swarm/wanted-pieces.js';

describe("a swarm download's wanted pieces", () => {
  const held = new Set<number>();
  const fresh = () => {
    held.clear();
    return new WantedPieces((index) => held.has(index));
  };

  it('wants only what the task does not hold, and says whether a run added anything', () => {
    const wanted = fresh();
    held.add(1);
    assert.equal(wanted.add({ first: 0, last: 2 }), true);
    assert.deepEqual([...wanted].sort(), [0, 2]);
    assert.equal(wanted.add({ first: 0, last: 2 }), false);
    assert.deepEqual(wanted.missing(), [0, 2]);
  });

  it('lets a client go on once its whole run is stored, not before', async () => {
    const wanted = fresh();
    wanted.add({ first: 0, last: 1 });
    let done = false;
    const waiting = wanted.wait({ first: 0, last: 1 }).then(() => (done = true));
    held.add(0);
    wanted.stored(0);
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(done, false);
    held.add(1);
    wanted.stored(1);
    await waiting;
    assert.equal(wanted.size, 0);
    await wanted.wait({ first: 0, last: 1 }); // stored already: at once
  });

  it('fails every waiter, now and later, once the download gives up', async () => {
    const wanted = fresh();
    wanted.add({ first: 0, last: 0 });
    const waiting = wanted.wait({ first: 0, last: 0 });
    wanted.fail(new Error('origin refused'));
    await assert.rejects(waiting, /origin refused/);
    await assert.rejects(wanted.wait({ first: 3, last: 3 }), /origin refused/);
    wanted.fail(new Error('second'));
    assert.equal(wanted.failed?.message, 'origin refused');
  });
});
