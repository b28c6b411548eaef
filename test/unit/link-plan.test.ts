import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { linkAt, planNodeLinks } from '../../bench/lib/link-plan.js';
import { seededRandom } from '../../bench/lib/random.js';
import { boundRatios, nodeBounds, timeToMove } from '../../bench/lib/node-bounds.js';
import { itemAt } from '../../src/common/indexing.js';

const first = (links: ReturnType<typeof planNodeLinks>) => links.map((l) => [l.steps[0].down, l.steps[0].up]);

describe('node link descriptions (shared by the emulated cluster and the simulator)', () => {
  it('gives every node one rate, both ways', () => {
    assert.deepEqual(first(planNodeLinks('10mbit', 3)), [
      [10e6, 10e6],
      [10e6, 10e6],
      [10e6, 10e6],
    ]);
  });

  it('deals groups out in an order drawn from the seed, with counts, shares and one group that takes the rest', () => {
    const links = planNodeLinks('10mbit*2,3mbit*25%,1gbit', 8);
    const count = (rate: number) => first(links).filter(([down, up]) => down === rate && up === rate).length;
    assert.deepEqual([count(10e6), count(3e6), count(1e9)], [2, 2, 4]);
    for (const link of links) assert.equal(link.group, { 10e6: '10mbit', 3e6: '3mbit', 1e9: '1gbit' }[link.steps[0].down]);
    // The same seed deals the same way; the slow group does not sit at the end.
    assert.deepEqual(first(planNodeLinks('10mbit*2,3mbit*25%,1gbit', 8)), first(links));
    const big = planNodeLinks('10mbit*24,3mbit*8', 32);
    assert.ok(
      big.slice(0, 24).some((l) => l.group === '3mbit'),
      'slow nodes among n0…n23',
    );
  });

  it('reads DOWN/UP as an asymmetric link', () => {
    assert.deepEqual(first(planNodeLinks('20mbit/5mbit*1,10mbit', 2)), [
      [20e6, 5e6],
      [10e6, 10e6],
    ]);
  });

  it('draws log-normal rates around their median, the same ones for the same seed', () => {
    const a = planNodeLinks('lognormal(50gbit,0.3)', 1000, '', seededRandom(7));
    const b = planNodeLinks('lognormal(50gbit,0.3)', 1000, '', seededRandom(7));
    assert.deepEqual(first(a), first(b));
    const downs = a.map((l) => l.steps[0].down).sort((x, y) => x - y);
    const median = itemAt(downs, 500);
    assert.ok(median > 45e9 && median < 55e9, `median ${median}`);
    assert.ok(itemAt(downs, 0) < 30e9 && itemAt(downs, 999) > 80e9, 'σ 0.3 spreads the rates');
    // One draw serves both directions unless DOWN/UP says otherwise.
    assert.ok(a.every((l) => l.steps[0].down === l.steps[0].up));
  });

  it("changes a node's link at a given second, to a rate or by a factor, and gives it a group of its own", () => {
    const links = planNodeLinks('10mbit*4', 4, 'n2=0.1x@20s,n3=2mbit/1mbit@5s');
    assert.deepEqual(links[2]?.steps, [
      { at: 0, down: 10e6, up: 10e6 },
      { at: 20, down: 1e6, up: 1e6 },
    ]);
    assert.deepEqual(linkAt(itemAt(links, 3), 6), { at: 5, down: 2e6, up: 1e6 });
    assert.deepEqual(linkAt(itemAt(links, 3), 4.9), { at: 0, down: 10e6, up: 10e6 });
    assert.equal(new Set(links.map((l) => l.group)).size, 3);
  });

  it('names what is wrong with a bad description', () => {
    assert.throws(() => planNodeLinks('10mbit*3', 4), /describe 3 nodes, not 4/);
    assert.throws(() => planNodeLinks('10mbit*3,3mbit*3', 4), /describe 6 nodes, not 4/);
    assert.throws(() => planNodeLinks('10mbit,3mbit', 4), /only one group may leave out its count/);
    assert.throws(() => planNodeLinks('10mbit,,3mbit*2', 4), /empty group/);
    assert.throws(() => planNodeLinks('10 furlongs', 4), /invalid rate "10 furlongs"/);
    assert.throws(() => planNodeLinks('lognormal(50gbit)', 4), /lognormal\(MEDIAN,SIGMA\)/);
    assert.throws(() => planNodeLinks('lognormal(50gbit,-1)', 4), /σ must be a number ≥ 0/);
    assert.throws(() => planNodeLinks('1mbit/2mbit/3mbit', 4), /one slash at most/);
    assert.throws(() => planNodeLinks('10mbit', 4, 'n4=1mbit@2s'), /only 4 nodes/);
    assert.throws(() => planNodeLinks('10mbit', 4, 'n1=1mbit'), /nNODE=RATE@SECONDS/);
    assert.throws(() => planNodeLinks('10mbit', 4, 'n1=0.5x/1mbit@3s'), /both sides as rates or both as factors/);
  });
});

describe("each node's own bound", () => {
  it('moves bytes at a rate that changes over time', () => {
    assert.equal(timeToMove(100, [{ at: 0, rate: 10 }]), 10);
    assert.equal(
      timeToMove(100, [
        { at: 0, rate: 10 },
        { at: 5, rate: 1 },
      ]),
      55,
    );
    assert.equal(timeToMove(100, [{ at: 0, rate: 0 }]), Infinity);
  });

  it('binds fast nodes by the aggregate or the source and slow ones by their own download', () => {
    // F = 80 Mbit = 10 MB; source 40 Mbit/s; 3 nodes at 10 Mbit/s and 1 at 2.
    const F = 10e6;
    const links = planNodeLinks('10mbit*3,2mbit', 4);
    const bounds = nodeBounds(F, 40e6, links);
    const fast = links.findIndex((l) => l.group === '10mbit');
    const slow = links.findIndex((l) => l.group === '2mbit');
    assert.equal(bounds[fast]?.binding, 'download'); // F/d = 8 s; F/u_s = 2 s; 4F/(40+32 Mbit/s) = 4.4 s
    assert.equal(bounds[fast]?.seconds, 8);
    assert.equal(bounds[slow]?.seconds, 40);
    // A slower source binds the fast ones.
    assert.equal(nodeBounds(F, 5e6, links)[fast]?.binding, 'source');
  });

  it("counts a link that slows down in that node's own bound", () => {
    const F = 10e6; // 8 s at 10 Mbit/s
    const links = planNodeLinks('10mbit*2', 2, 'n1=0.1x@4s');
    const [steady, slowed] = nodeBounds(F, 100e6, links);
    assert.equal(steady?.seconds, 8);
    // 4 s at 10 Mbit/s (5 MB), then 5 MB at 1 Mbit/s: 40 s more.
    assert.equal(slowed?.seconds, 44);
  });

  it('reports the median and the worst of done / bound, overall and per group', () => {
    const r = boundRatios([
      { node: 'n0', done: 10, bound: 8, group: 'fast' },
      { node: 'n1', done: 12, bound: 8, group: 'fast' },
      { node: 'n2', done: 9, bound: 8, group: 'fast' },
      { node: 'n3', done: 44, bound: 40, group: 'slow' },
    ]);
    assert.equal(r.overall.worst, 1.5);
    assert.equal(r.overall.worstNode, 'n1');
    assert.deepEqual(
      r.groups.map((g) => [g.group, g.nodes, g.median]),
      [
        ['fast', 3, 1.25],
        ['slow', 1, 1.1],
      ],
    );
  });
});
