import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { lowerBound } from '../../bench/lib/lower-bound.js';
import { planNodeLinks } from '../../bench/lib/link-plan.js';
import { EventQueue } from '../../sim/event-queue.js';
import { Network, runUntil, type Flow } from '../../sim/network.js';
import { defaultSetup, run } from '../../sim/scenario.js';
import { defaultPeerSettings } from '../../sim/peer.js';
import { defaultScheduling } from '../../src/scheduler/config.js';

/** A network with payload = nominal rate (efficiency 1), no latency; rates given in bytes/s. */
function network(quantum = 0) {
  const queue = new EventQueue();
  const net = new Network(queue, { efficiency: 1, quantum, latency: { sameRack: 0, crossRack: 0, crossZone: 0 } });
  const rack = net.rack('r', net.zone('z'));
  const host = (name: string, upBytes?: number, downBytes?: number) =>
    net.host(name, rack, upBytes === undefined ? undefined : upBytes * 8, downBytes === undefined ? undefined : downBytes * 8);
  const done = new Map<string, number>();
  const flow = (name: string, from: ReturnType<typeof host>, to: ReturnType<typeof host>, bytes: number): Flow =>
    net.start(from, to, bytes, () => done.set(name, queue.now));
  const settle = () => runUntil(queue, net, () => false);
  return { queue, net, host, flow, done, settle };
}

const close = (actual: number | undefined, expected: number, what: string) =>
  assert.ok(actual !== undefined && Math.abs(actual - expected) < 1e-9 * Math.max(1, expected), `${what}: ${actual} ≠ ${expected}`);

describe('sim network: max-min fair sharing', () => {
  it("splits a sender's uplink equally between two unconstrained receivers", () => {
    const { net, host, flow } = network();
    const a = host('a', 10);
    const f1 = flow('1', a, host('b', undefined, 100), 100);
    const f2 = flow('2', a, host('c', undefined, 100), 100);
    net.recompute();
    close(f1.rate, 5, 'a→b');
    close(f2.rate, 5, 'a→c');
  });

  it("gives a flow held back by its receiver's downlink only that, and the rest of the uplink to the other", () => {
    const { net, host, flow } = network();
    const a = host('a', 10);
    const slow = flow('slow', a, host('b', undefined, 2), 100);
    const fast = flow('fast', a, host('c', undefined, 100), 100);
    net.recompute();
    close(slow.rate, 2, 'a→b (receiver-bound)');
    close(fast.rate, 8, 'a→c (takes the remaining uplink)');
  });

  it('solves a chain of shared links: a→c, b→c, b→d', () => {
    // a.up 10, b.up 10, c.down 10, d.down 100: c's downlink and b's uplink both bind at 5 each.
    const { net, host, flow } = network();
    const a = host('a', 10);
    const b = host('b', 10);
    const c = host('c', undefined, 10);
    const d = host('d', undefined, 100);
    const ac = flow('ac', a, c, 1);
    const bc = flow('bc', b, c, 1);
    const bd = flow('bd', b, d, 1);
    net.recompute();
    close(ac.rate, 5, 'a→c');
    close(bc.rate, 5, 'b→c');
    close(bd.rate, 5, 'b→d');
  });

  it("hands a finished flow's share to the others (completion times)", () => {
    // a.up 10 B/s: 10 B and 30 B to two receivers. Both at 5 B/s until t = 2, then 20 B at 10 B/s.
    const { host, flow, done, settle } = network();
    const a = host('a', 10);
    flow('short', a, host('b', undefined, 100), 10);
    flow('long', a, host('c', undefined, 100), 30);
    settle();
    close(done.get('short'), 2, 'short done');
    close(done.get('long'), 4, 'long done');
  });

  it('counts rack uplinks on cross-rack paths only', () => {
    const queue = new EventQueue();
    const net = new Network(queue, { efficiency: 1, quantum: 0, latency: { sameRack: 1e-6, crossRack: 2e-6, crossZone: 3e-6 } });
    const zone = net.zone('z');
    const r1 = net.rack('r1', zone, 8 * 4); // 4 B/s out of and into the rack
    const r2 = net.rack('r2', zone, 8 * 4);
    const a = net.host('a', r1, 8 * 10, 8 * 10);
    const b = net.host('b', r1, 8 * 10, 8 * 10);
    const c = net.host('c', r2, 8 * 10, 8 * 10);
    const inRack = net.start(a, b, 1, () => undefined);
    const across = net.start(a, c, 1, () => undefined);
    net.recompute();
    close(across.rate, 4, 'a→c through the rack uplink');
    close(inRack.rate, 6, 'a→b inside the rack');
    assert.equal(net.latency(a, b), 1e-6);
    assert.equal(net.latency(a, c), 2e-6);
  });

  it('with a quantum, a flow that starts between recomputations waits for the next one', () => {
    // a.up 10 B/s; 10 B to b from t = 0, 10 B to c from t = 0.3.
    const timeline = (quantum: number) => {
      const { queue, net, host, flow, done, settle } = network(quantum);
      const a = host('a', 10);
      flow('b', a, host('b', undefined, 100), 10);
      queue.at(0.3, () => flow('c', a, host('c', undefined, 100), 10));
      settle();
      return { b: done.get('b'), c: done.get('c'), recomputations: net.recomputations };
    };
    // Exact: shared 5/5 from 0.3; b has 7 B left → done at 1.7; c's last 3 B alone → 2.0.
    const exact = timeline(0);
    close(exact.b, 1.7, 'exact: b');
    close(exact.c, 2.0, 'exact: c');
    // Quantum 1 s: c gets no rate until t = 1 (b, alone, is done by then); c alone → 2.0.
    const coarse = timeline(1);
    close(coarse.b, 1, 'quantum: b');
    close(coarse.c, 2, 'quantum: c');
    assert.equal(coarse.recomputations, 3); // t = 0, 1, 2
  });
});

describe('sim network: links that change mid-run', () => {
  it('moves a flow on at its old rate up to the change, then at the new one', () => {
    // a.up 10 B/s; 100 B to b; at t = 4 a's uplink drops to 1 B/s: 40 B by then, 60 B at 1 B/s.
    const { queue, net, host, flow, done, settle } = network();
    const a = host('a', 10);
    flow('b', a, host('b', undefined, 100), 100);
    const up = a.up;
    assert.ok(up, 'a has an uplink');
    queue.at(4, () => net.setRate(up, 8 * 1));
    settle();
    close(done.get('b'), 64, 'done');
  });
});

describe('sim: the lower bound', () => {
  it('computes Kumar–Ross T* on a small case', () => {
    // F = 100 B, source 10 B/s, 4 peers uploading 5 B/s, slowest download 20 B/s:
    // F/us = 10, F/dmin = 5, N·F/(us + Σui) = 400/30 = 13.33 → the aggregate term binds.
    const lb = lowerBound({ F: 100, us: 10, ui: [5, 5, 5, 5], dmin: 20 });
    assert.equal(lb.binding, 'aggregate');
    close(lb.seconds, 400 / 30, 'T*');
  });

  it("matches the emulated cluster's T* (64 MiB, 20 Mbit/s nodes, 80 Mbit/s source)", () => {
    const r = run('direct', defaultSetup({ nodes: 8 }));
    assert.equal(r.lowerBound.binding, 'download');
    assert.equal(r.lowerBound.seconds.toFixed(2), '26.84');
  });
});

describe('sim: a tiny swarm through the real scheduler', () => {
  it('gets every piece to every node exactly once, with the registry sending one copy', () => {
    const size = 12 * 4 * 2 ** 20; // 12 pieces of 4 MiB
    const r = run(
      'p2p',
      defaultSetup({
        nodes: 6,
        size,
        nodeUp: 100e6,
        nodeDown: 100e6,
        seedUp: 200e6,
        seedDown: 200e6,
        registryUp: 200e6,
        noise: 0.2,
        rngSeed: 3,
      }),
    );
    assert.equal(r.pieceCount, 12);
    assert.ok(
      r.ready.every((t) => Number.isFinite(t) && t > 0),
      'every node ready',
    );
    // Each node stored each piece once: exactly one blob's worth written, and its bytes came
    // from the seed or from other nodes (never from the origin: the seed read it).
    assert.equal(r.writtenAtEnd, size);
    close(r.copiesFromSeeds + r.copiesFromNodes, 6, 'copies received by the nodes');
    assert.equal(r.copiesFromOrigin, 0);
    assert.equal(r.registryBytesTotal, size, 'the registry sent one copy');
    assert.equal(r.cyclesDetected, 0);
    assert.ok(r.last >= r.lowerBound.seconds, 'no faster than the lower bound');
  });

  it('the endgame waits for the tail: little is thrown away where the eager one threw away half', () => {
    // 32 nodes sharing slow links: pieces take long, so the eager endgame (a second parent for
    // every piece on its way whenever the parents had nothing new) doubled most transfers.
    const setup = (eagerEndgame: boolean) =>
      defaultSetup({
        nodes: 32,
        size: 64 * 2 ** 20,
        nodeUp: 10e6,
        nodeDown: 10e6,
        seedUp: 40e6,
        seedDown: 40e6,
        registryUp: 40e6,
        noise: 0.2,
        rngSeed: 1,
        peer: { ...defaultPeerSettings(), eagerEndgame },
        // The mesh, whose many parents the endgame's second asks come from.
        scheduling: { ...defaultScheduling(), shape: 'mesh' },
      });
    const tail = run('p2p', setup(false));
    const eager = run('p2p', setup(true));
    // 8-9 copies while a busy new parent was left alone 250 ms; about 5 since it is asked again sooner.
    assert.ok(eager.abortedBytes > 4 * eager.size, `eager endgame aborted ${eager.abortedBytes / eager.size} copies`);
    assert.ok(tail.abortedBytes < 1 * tail.size, `tail endgame aborted ${tail.abortedBytes / tail.size} copies`);
    assert.ok(tail.last < eager.last, `tail ${tail.last} s against eager ${eager.last} s`);
  });

  it('a lazy start takes the footer and TOC from the last piece, which the seed reads first', () => {
    // 256 MiB at 80 Mbit/s: the seed's whole read takes ~28 s. A node needs the TOC's piece and a
    // 6.2% prefix, 20 MiB, which its 20 Mbit/s link brings in ~9 s once the seed has them.
    const setup = (originInOrder: boolean) =>
      defaultSetup({ nodes: 4, size: 256 * 2 ** 20, noise: 0.2, rngSeed: 1, peer: { ...defaultPeerSettings(), originInOrder } });
    const wholeRead = (256 * 2 ** 20 * 8) / 80e6;
    const tailFirst = run('lazy', setup(false));
    const inOrder = run('lazy', setup(true));
    assert.ok(inOrder.first >= wholeRead, `in order, the first node waits for the whole read: ${inOrder.first} s`);
    assert.ok(tailFirst.last < wholeRead / 2, `last piece first: every node ready after ${tailFirst.last} s`);
  });

  it('takes one link per node, changes it mid-run, and measures each node against its own bound', () => {
    const size = 16 * 2 ** 20;
    // Groups are dealt in an order drawn from the seed: find the slow node, and slow a fast one.
    const dealt = planNodeLinks('20mbit*3,5mbit', 4);
    const slow = dealt.findIndex((l) => l.group === '5mbit');
    const slowed = dealt.findIndex((l) => l.group === '20mbit');
    const setup = defaultSetup({
      nodes: 4,
      size,
      efficiency: 1,
      latency: { sameRack: 0, crossRack: 0, crossZone: 0 },
      registryUp: 40e6,
      links: planNodeLinks('20mbit*3,5mbit', 4, `n${slowed}=0.5x@2s`),
    });
    const r = run('direct', setup);
    // The slow node at 5 Mbit/s: its own bound is F/5 Mbit/s; the slowed one goes from 20 to 10 at 2 s.
    close(r.bounds[slow], (size * 8) / 5e6, 'slow node bound');
    close(r.bounds[slowed], 2 + (size * 8 - 2 * 20e6) / 10e6, 'slowed node bound');
    assert.deepEqual(r.ownBound.groups.map((g) => g.nodes).sort(), [1, 1, 2]);
    // Direct pulls share the registry's 40 Mbit/s: the fast nodes get 11.7 Mbit/s, not their 20.
    const fast = r.ownBound.groups.find((g) => g.nodes === 2);
    assert.ok(fast, 'the two fast nodes form a group');
    assert.ok(fast.median > 1.5, `fast nodes at ${fast.median} of their bound`);
  });

  it('direct pulls: the registry sends N copies and the last node ends at N·F/u', () => {
    const size = 16 * 2 ** 20;
    const r = run('direct', defaultSetup({ nodes: 4, size, efficiency: 1, latency: { sameRack: 0, crossRack: 0, crossZone: 0 } }));
    assert.equal(r.registryBytesTotal, 4 * size);
    close(r.last, (4 * size) / (80e6 / 8), 'last node');
  });
});
