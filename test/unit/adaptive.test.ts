// The adaptive shape's placement rules on the pure scheduling engine (hand-driven clock, no I/O):
// what it measures from piece reports, and where it puts slow and fast peers.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { silentLogger } from '../../src/common/log.js';
import { hostInfo as host } from '../fixtures/host-info.js';
import type { HostInfo, SchedulerPacket } from '../../src/rpc/scheduler-api.js';
import { defaultScheduling, schedulingSchema, type SchedulingConfig } from '../../src/scheduler/config.js';
import {
  canTake,
  chainChildren,
  chainToMerge,
  expectedPace,
  heldBack,
  misplaced,
  paceOf,
  passengerCap,
  probeTargets,
  riderFits,
  slowFeeder,
} from '../../src/scheduler/placement.js';
import { graphHasCycle, Resources, type Peer } from '../../src/scheduler/resources.js';
import { Scheduling } from '../../src/scheduler/scheduling.js';

const TASK = `sha256:${'b'.repeat(64)}`;
const PIECE = 4 * 1024 * 1024;
const PIECES = 16;
/** A node's piece time on its link (about 10 MB/s), in ms. */
const FAST = 400;

/** The engine in the adaptive shape, with a hand-driven clock and every piece's digest known. */
function engine(config: Partial<SchedulingConfig> = {}, pieces = PIECES) {
  let now = 1_000;
  const packets = new Map<string, SchedulerPacket[]>();
  const scheduling = new Scheduling(
    new Resources(),
    { ...defaultScheduling(), shape: 'adaptive', ...config },
    { now: () => now, triggerSeed: async () => undefined },
    silentLogger,
  );
  const join = (id: string, info: Partial<HostInfo> = {}, held: number[] = [], taskId = TASK) => {
    scheduling.announceHost(host(id, info));
    const peerId = `${id}|${taskId}`;
    const received: SchedulerPacket[] = [];
    packets.set(peerId, received);
    return scheduling.register(
      {
        peerId,
        hostId: id,
        taskId,
        contentLength: pieces * PIECE,
        pieceSize: PIECE,
        origin: { url: 'http://registry/v2/x/blobs/d', headers: {} },
        heldPieces: held,
      },
      (packet) => received.push(packet),
    );
  };
  // The task the peers join: keyed by the registry of their origin URL.
  const task = scheduling.resources.task(TASK, pieces * PIECE, PIECE, now, 'http://registry');
  for (let i = 0; i < pieces; i++) scheduling.learnDigest(task, i, `sha256:${i.toString(16).padStart(64, '0')}`);
  /** Piece `index` starts arriving at `peer` now. */
  const starts = (peer: Peer, index: number) => scheduling.pieceStarted(peer, index);
  /** Piece `index` is stored at `peer` now, from its first parent (or the origin). */
  const stores = (peer: Peer, index: number, costMs = FAST) => {
    const parent = peer.parents[0];
    scheduling.pieceFinished(peer, {
      index,
      digest: parent ? '' : `sha256:${index.toString(16).padStart(64, '0')}`,
      parentId: parent?.id ?? '',
      costMs,
      fromOrigin: !parent,
      length: PIECE,
    });
  };
  const lastParents = (peer: Peer) => {
    const packet = [...(packets.get(peer.id) ?? [])].reverse().find((p) => p.packet === 'parents');
    return packet?.packet === 'parents' ? packet.parents.parents.map((p) => p.peerId.split('|')[0]) : undefined;
  };
  return { scheduling, join, starts, stores, lastParents, task, pieces, now: () => now, at: (ms: number) => (now = ms) };
}

const all = (n: number) => [...Array(n).keys()];

type Engine = ReturnType<typeof engine>;

/** A seed that read its first four pieces from the origin 4 times as fast as a node receives. */
function fastSeed(e: Engine): Peer {
  const seed = e.join('seed', { seed: true });
  e.starts(seed, 0);
  for (let k = 0; k < 4; k++) {
    e.at(1_000 + ((k + 1) * FAST) / 4);
    e.stores(seed, k, 0);
  }
  return seed;
}

/** Piece `index` starts arriving at `peer` now and is stored at `at` ms. */
function receives(e: Engine, peer: Peer, index: number, at: number): void {
  e.starts(peer, index);
  e.at(at);
  e.stores(peer, index);
}

/** A seed holding the blob, and a chain seed → a → s → c whose first piece is on its way down. */
function chainWithMiddle(e: ReturnType<typeof engine>) {
  e.join('seed', { seed: true }, all(PIECES));
  const a = e.join('a');
  e.starts(a, 0);
  const s = e.join('s');
  e.starts(s, 0);
  const c = e.join('c');
  e.starts(c, 0);
  assert.deepEqual(
    [a, s, c].map((p) => e.lastParents(p)),
    [['seed'], ['a'], ['s']],
    'a pipeline of one child per peer to begin with',
  );
  return { a, s, c };
}

/**
 * The chain of chainWithMiddle with s as slow as a peer 4 times slower than a: a keeps a node's
 * pace and s is still on its first piece after three of a's. With `otherLayers`, s also receives
 * that many more blobs from the seed at the same time (layers mounted at once), each a task.
 */
function slowMiddle(otherLayers = 0) {
  const e = engine();
  const peers = chainWithMiddle(e);
  for (let layer = 1; layer <= otherLayers; layer++) {
    const taskId = `sha256:${String(layer).repeat(64)}`;
    e.join('seed', { seed: true }, all(PIECES), taskId);
    const alsoS = e.join('s', {}, [], taskId);
    assert.equal(alsoS.state, 'running', `s reads layer ${layer} too`);
    e.starts(alsoS, 0);
  }
  for (let k = 0; k < 3; k++) {
    e.at(1_000 + (k + 1) * FAST);
    e.stores(peers.a, k);
    e.starts(peers.a, k + 1);
  }
  e.at(1_000 + 3.2 * FAST);
  e.scheduling.tick();
  return { e, ...peers };
}

describe('adaptive shape: measuring from piece reports', () => {
  it('is the default shape, and the others stay as overrides', () => {
    assert.equal(defaultScheduling().shape, 'adaptive');
    for (const shape of ['mesh', 'pipeline', 'adaptive']) assert.equal(schedulingSchema.parse({ shape }).shape, shape);
  });

  it('finds a child slow by its copy of a piece its parent has long stored, while the piece still arrives', () => {
    const e = engine();
    const { a, s } = chainWithMiddle(e);
    e.at(1_000 + FAST);
    e.stores(a, 0);
    e.starts(a, 1);
    e.at(1_000 + 1.3 * FAST);
    e.scheduling.tick();
    assert.equal(s.host.links.downCap, undefined, 'not yet: 1.3 times as long as its parent took for it');
    // s has been receiving piece 0 for twice as long as a took for it: at most half a's rate.
    e.at(1_000 + 2 * FAST);
    e.stores(a, 1);
    e.starts(a, 2);
    const cap = s.host.links.downCap;
    assert.ok(cap !== undefined && cap <= PIECE / (2 * FAST), `s capped at ${cap}`);
    assert.equal(a.host.links.downCap, undefined);
  });

  it('on a fast link, does not find a child slow whose piece is late by less than the reports can tell', () => {
    // Pieces of a millisecond: a stores one every 1 ms while s's copy of piece 0, begun with a's,
    // still arrives, checked at each of a's stores. A millisecond of lateness is of the order of a
    // report's own delay: s is found slow only once its piece is 2 ms past its due time (a's 1 ms).
    const e = engine();
    const { a, s } = chainWithMiddle(e);
    const aStores = (k: number) => {
      e.at(1_000 + k + 1);
      e.stores(a, k);
      e.starts(a, k + 1);
    };
    aStores(0);
    aStores(1);
    assert.equal(s.host.links.downCap, undefined, 'not found slow 1 ms past its due time (twice as long as a took)');
    aStores(2);
    assert.ok(s.host.links.downCap !== undefined, 'found slow 2 ms past its due time');
    assert.equal(a.host.links.downCap, undefined);
  });

  it('does not find a chain slow that keeps its pace, piece for piece', () => {
    const e = engine();
    const { a, s, c } = chainWithMiddle(e);
    for (let k = 0; k < 4; k++) {
      e.at(1_000 + (k + 1) * FAST);
      for (const peer of [a, s, c]) {
        e.stores(peer, k);
        if (k + 1 < PIECES) e.starts(peer, k + 1);
      }
      e.scheduling.tick();
    }
    assert.deepEqual(
      [a, s, c].map((p) => p.host.links.cap),
      [undefined, undefined, undefined],
    );
    assert.deepEqual(
      [a, s, c].map((p) => e.lastParents(p)),
      [['seed'], ['a'], ['s']],
      'nobody moved',
    );
  });
});

describe('adaptive shape: a piece judged against the parent it comes from', () => {
  /**
   * slowMiddle's chain after s went to ride: c moved up under a, as its piece 0 came in. A piece c
   * asked of s before the move begins to arrive only now (`parentId` says from whom, or nothing does), and still arrives
   * at s's slow pace long after a stored its own copy; a keeps its pace meanwhile.
   */
  function pieceFromTheOldParent(sayParent: boolean) {
    const { e, a, s, c } = slowMiddle();
    assert.equal(c.parents[0], a, 'c moved under a');
    e.stores(c, 0);
    e.scheduling.pieceStarted(c, 1, sayParent ? { parentId: s.id } : {});
    for (let k = 3; k < 8; k++) {
      e.at(1_000 + (k + 0.3) * FAST);
      e.stores(a, k);
      e.starts(a, k + 1);
    }
    e.scheduling.tick();
    return c;
  }

  it('does not find a child slow by a piece still arriving from the parent it was moved off', () => {
    assert.equal(pieceFromTheOldParent(true).host.links.downCap, undefined);
  });

  /**
   * As pieceFromTheOldParent, and c's next piece, from a (which holds it), crawls too: the
   * download's cap found within `pieceTimes` of its start, if any.
   */
  function crawlingUnderTheNewParent(pieceTimes: number) {
    const { e, a, s, c } = slowMiddle();
    e.stores(c, 0);
    e.scheduling.pieceStarted(c, 1, { parentId: s.id });
    const began = e.now();
    e.scheduling.pieceStarted(c, 2, { parentId: a.id });
    // a keeps its pace meanwhile.
    for (let k = 3; 1_000 + (k + 1) * FAST < began + pieceTimes * FAST; k++) {
      e.at(1_000 + (k + 1) * FAST);
      e.stores(a, k);
      e.starts(a, k + 1);
    }
    e.at(began + pieceTimes * FAST);
    e.scheduling.tick();
    return c.host.links.downCap;
  }

  it("finds it slow when a piece of the new parent's crawls too: all it can have received, the old piece counted whole, is far below the feed", () => {
    // Due in a piece time at a's pace (s rides elsewhere by then), twice that with the old piece sharing the download.
    assert.equal(crawlingUnderTheNewParent(2.5), undefined, 'within 2 / SLOW piece times: the old piece may have taken half its download');
    const cap = crawlingUnderTheNewParent(6);
    // A bound: both pieces whole, and c's piece 0 stored as piece 2 began, over the time since.
    assert.ok(cap !== undefined && cap >= (2 * PIECE) / (6 * FAST) && cap < PIECE / FAST / 1.5, `capped below what a feeds, at ${cap}`);
  });

  /**
   * As crawlingUnderTheNewParent, c's old piece (from s) and its first from a arrive together, and
   * the old one is stored `storedAfter` piece times after both began, while the new one still
   * arrives: the download's cap found `judgedAfter` piece times after they began, if any.
   */
  function oldPieceStoredMeanwhile(storedAfter: number, judgedAfter: number) {
    const { e, a, s, c } = slowMiddle();
    e.stores(c, 0);
    const began = e.now();
    e.scheduling.pieceStarted(c, 1, { parentId: s.id });
    e.scheduling.pieceStarted(c, 2, { parentId: a.id });
    let k = 3;
    const aKeepsItsPace = (until: number) => {
      for (; 1_000 + (k + 1) * FAST <= until; k++) {
        e.at(1_000 + (k + 1) * FAST);
        e.stores(a, k);
        e.starts(a, k + 1);
      }
    };
    aKeepsItsPace(began + storedAfter * FAST);
    e.at(began + storedAfter * FAST);
    e.stores(c, 1);
    e.scheduling.tick();
    aKeepsItsPace(began + judgedAfter * FAST);
    e.at(began + judgedAfter * FAST);
    e.scheduling.tick();
    return c.host.links.downCap;
  }

  it('a piece that shared the download with an old piece stored meanwhile is judged with that piece', () => {
    // a feeds c at half its pace (s rides under it too): c's new piece is due in two piece times.
    // When the old piece is stored after three, the new one alone is late, but the download
    // carried two pieces in three piece times: shared, not slow.
    assert.equal(oldPieceStoredMeanwhile(3, 3), undefined, 'not found slow as the old piece is stored');
    assert.equal(oldPieceStoredMeanwhile(3, 3.5), undefined, 'nor just after');
    const cap = oldPieceStoredMeanwhile(3, 7);
    // Found once its download carried less than SLOW (0.7) of a's share for it.
    assert.ok(cap !== undefined && cap < (0.7 * PIECE) / (2 * FAST), `one that then crawls on is found slow: capped at ${cap}`);
  });

  it("a piece whose parent was not said, begun after the move, is taken for the new parent's (the rule for older peers)", () => {
    assert.ok(pieceFromTheOldParent(false).host.links.downCap !== undefined, 'c found slow against a: the case the parent id tells apart');
  });
});

describe("adaptive shape: a piece judged at the share of its parent's upload it began with", () => {
  /**
   * A seed whose upload carries one node's pace feeds a and b at once: each piece comes at half
   * that pace. With `bGoes`, b leaves halfway through their first pieces, and the seed's upload is
   * a's alone from then on. a's piece is checked `after` piece times at the seed's pace.
   */
  function sharedSeed(bGoes: boolean, after = 2.2) {
    const e = engine({ pipeline: { fanout: 1, seedFanout: 2 } });
    const seed = e.join('seed', { seed: true }, all(PIECES));
    seed.host.links.foundUploadFull(PIECE / FAST);
    const a = e.join('a');
    const b = e.join('b');
    assert.deepEqual([e.lastParents(a), e.lastParents(b)], [['seed'], ['seed']], 'the seed feeds both');
    e.starts(a, 0);
    e.starts(b, 0);
    if (bGoes) {
      e.at(1_000 + 1.5 * FAST);
      e.scheduling.leave(b);
    }
    e.at(1_000 + after * FAST);
    e.scheduling.tick();
    return a;
  }

  it('a child whose piece came at half pace while a sibling shared the upload is not found slow when the sibling goes', () => {
    assert.equal(sharedSeed(true).host.links.downCap, undefined);
  });

  it('a piece that comes far slower than even the shared pace is still found slow', () => {
    // Due in two piece times at half the pace: late past 2 / SLOW of them.
    assert.ok(sharedSeed(true, 3.5).host.links.downCap !== undefined);
    assert.ok(sharedSeed(false, 3.5).host.links.downCap !== undefined);
    assert.equal(sharedSeed(false).host.links.downCap, undefined, 'at 2.2 piece times it keeps the shared pace');
  });
});

describe('adaptive shape: what a peer not measured yet is expected to feed', () => {
  it('as much as any parent, until what it received, or its parent feeds, is far below the reference', () => {
    const e = engine();
    e.join('seed', { seed: true }, all(PIECES));
    // q, measured at a node's pace: the reference.
    const q = e.join('q');
    for (let k = 0; k < 4; k++) {
      e.starts(q, k);
      e.at(e.now() + FAST);
      e.stores(q, k);
    }
    e.starts(q, 4);
    const p = e.join('p');
    e.starts(p, 0);
    const c = e.join('c');
    assert.deepEqual(
      [p, c].map((peer) => e.lastParents(peer)),
      [['q'], ['p']],
    );
    assert.equal(paceOf(p), undefined, 'p has stored nothing');
    assert.equal(expectedPace(p, e.now()), Infinity, 'its first piece just began: nothing says it is slow');
    // Three of a node's piece times later, p's first piece still arrives: p receives at most a third of the reference.
    e.at(e.now() + 3 * FAST);
    const bound = PIECE / (3 * FAST);
    assert.ok(expectedPace(p, e.now()) <= bound, `p: at most ${bound} B/ms, not ${expectedPace(p, e.now())}`);
    assert.ok(expectedPace(c, e.now()) <= bound, 'c, below it, no more');
  });
});

describe('adaptive shape: where slow peers go', () => {
  it('a peer slow against the fastest nodes rides as a passenger, and its chain child takes its place', () => {
    const { e, a, s, c } = slowMiddle();
    assert.ok(passengerCap(s) !== undefined, 's rides as a passenger');
    assert.deepEqual(e.lastParents(c), ['a'], 'c moved up under a, past the slow peer');
    assert.equal(c.parents[0], a);
    assert.ok(!s.children.has(c));
    assert.equal(graphHasCycle(e.task), false);
    // A passenger feeds no chain: a new node is not given s.
    assert.equal(canTake(s, e.join('late'), e.scheduling.config), false);
  });

  it('a passenger moves off a chain feeder to a peer that feeds no chain', () => {
    const { e, a, s } = slowMiddle();
    assert.equal(s.parents[0], a, 'still under a, which now feeds the chain through c');
    // A peer at a chain's end, holding pieces s lacks.
    e.join('end', {}, [3, 4, 5]);
    e.scheduling.tick();
    assert.deepEqual(e.lastParents(s), ['end']);
    assert.ok(passengerCap(s) !== undefined);
  });

  it("a node receiving at its own download's cap is not held back, however fast the fastest node is", () => {
    const e = engine();
    e.join('seed', { seed: true }, all(PIECES));
    const x = e.join('x');
    e.task.adaptive.referenceRate = 10_000;
    // x was found to download at 3,000 bytes/ms: at 2,500 it receives what its link allows.
    x.host.links.downCap = 3_000;
    assert.equal(heldBack(x, 2_500), false);
    assert.equal(heldBack(x, 1_500), true, 'at half its own rate a parent holds it back');
    // A node not found slow is judged against the fastest one.
    x.host.links.downCap = undefined;
    assert.equal(heldBack(x, 2_500), true);
  });

  it('a seed whose link carries several chains takes a chain child beyond its fan-out', () => {
    const e = engine();
    const seed = fastSeed(e);
    assert.equal(seed.state, 'backToSource');
    const a = e.join('a');
    receives(e, a, 0, 1_000 + 2 * FAST);
    receives(e, a, 1, 1_000 + 3 * FAST);
    const b = e.join('b');
    assert.deepEqual(e.lastParents(b), ['seed'], 'the seed has room for b; a pipeline would chain it under a');
    assert.equal(seed.children.size, 2);
  });

  it('takes one chain child by its room at a time: a score of peers joining at once do not all go under it', () => {
    const e = engine();
    const seed = fastSeed(e);
    // The first node received at a quarter of a node's rate (a loaded machine at a swarm's start):
    // the reference reads low, and the seed's room as if sixteen such chains fitted.
    const a = e.join('a');
    receives(e, a, 0, 1_000 + 4 * FAST);
    receives(e, a, 1, 1_000 + 8 * FAST);
    e.starts(a, 2);
    const joined = all(10).map((i) => e.join(`j${i}`));
    assert.equal(seed.children.size, 2, 'a and one more: the next waits until that one shows what it takes');
    const [first] = joined;
    assert.ok(first);
    assert.deepEqual(e.lastParents(first), ['seed']);
    receives(e, first, 1, 1_000 + 9 * FAST);
    receives(e, first, 2, 1_000 + 10 * FAST);
    assert.equal(seed.children.size, 3, 'its chain children measured, the seed takes one more of those waiting');
  });
});

describe("adaptive shape: a host's tasks share its links", () => {
  it('a node receiving four layers at once, each at a quarter of its link, is not found slow', () => {
    const { e, a, s, c } = slowMiddle(3);
    assert.equal(s.host.links.downCap, undefined, 'no cap on its download');
    assert.equal(passengerCap(s), undefined, 'it keeps its chain slot');
    assert.deepEqual(e.lastParents(c), ['s'], 'c stays under s');
    assert.equal(a.host.links.cap, undefined);
  });

  it('with one other layer arriving, the same pace is still slow: its host received less than its parent fed', () => {
    const { s } = slowMiddle(1);
    const cap = s.host.links.downCap;
    assert.ok(cap !== undefined, 's found slow');
    // Its host's rate: this task's share counted twice (both transfers shared the download).
    assert.ok(cap <= (2 * PIECE) / (3 * FAST) && cap > PIECE / (3.2 * FAST), `s capped at ${cap} for both transfers together`);
  });
});

/**
 * s found slow under a (chainWithMiddle, slowMiddle's pace), then moved under another parent
 * where it receives at a node's full rate: its download was never the problem. With
 * `aDelivered`, a's children were just measured receiving from it at a node's full pace, and a
 * keeps that pace meanwhile. With `backUnderA`, the parent it then receives at that rate from is
 * a itself (which keeps its pace).
 */
function slowUnderAFastElsewhere(aDelivered: boolean, backUnderA = false) {
  const e = engine();
  const { a, s } = chainWithMiddle(e);
  if (aDelivered) a.host.links.delivered(1_000, 1_000 + FAST, PIECE, 8);
  for (let k = 0; k < 3; k++) {
    e.at(1_000 + (k + 1) * FAST);
    e.stores(a, k);
    e.starts(a, k + 1);
  }
  e.at(1_000 + 3.2 * FAST);
  e.scheduling.tick();
  assert.ok(s.host.links.downCap !== undefined, 's found slow under a');
  const other = backUnderA ? a : e.join('other', {}, all(PIECES));
  s.parents.forEach((p) => p.children.delete(s));
  s.parents = [other];
  other.children.add(s);
  s.parentsSince = e.now();
  // Its slow piece ends: what a delivered lately spans it.
  if (backUnderA) e.stores(s, 0);
  for (let k = 1; k <= 4; k++) {
    e.starts(s, k);
    e.at(e.now() + FAST);
    e.stores(s, k);
    if (aDelivered || backUnderA) {
      e.stores(a, k + 2);
      e.starts(a, k + 3);
    }
  }
  assert.equal(s.host.links.downCap, undefined, "s's cap is gone");
  return { a, s };
}

describe('adaptive shape: a slow upload', () => {
  it("when a child found slow does clearly better under another parent, the blame moves to the first parent's upload", () => {
    const { a } = slowUnderAFastElsewhere(false);
    assert.ok(a.host.links.upCap !== undefined, 'a is slow to upload');
    assert.ok(slowFeeder(a), 'and feeds no chain');
  });

  it('a parent just seen delivering a chain its full pace is not blamed when a child it fed slowly does better elsewhere', () => {
    const { a } = slowUnderAFastElsewhere(true);
    assert.equal(a.host.links.upCap, undefined, "a's upload is not capped: it was seen doing better than s received");
    assert.equal(slowFeeder(a), false, 'a keeps feeding its chain');
  });

  it('a parent is not blamed when the faster pieces that clear its child come from it', () => {
    const { a } = slowUnderAFastElsewhere(false, true);
    assert.equal(a.host.links.upCap, undefined, "a's upload is not capped: it just fed s faster than s's cap");
    assert.equal(slowFeeder(a), false, 'a keeps feeding its chain');
  });
});

describe('adaptive shape: an announced upload limit', () => {
  it('a peer announcing an upload far below what nodes receive gives its chain up once that is measured', () => {
    const e = engine();
    e.join('seed', { seed: true }, all(PIECES));
    // t announces 1/10 of a node's rate (bytes per second), and gets the seed's chain slot first.
    const t = e.join('t', { uploadBandwidth: (PIECE / FAST) * 100 });
    e.starts(t, 0);
    const a = e.join('a');
    e.starts(a, 0);
    const b = e.join('b');
    assert.deepEqual(
      [t, a, b].map((p) => e.lastParents(p)),
      [['seed'], ['t'], ['a']],
      'nothing measured yet: a pipeline',
    );
    // t receives at a node's pace: now its limit is far below what a node receives.
    for (let k = 0; k < 4; k++) {
      e.at(1_000 + (k + 1) * FAST);
      e.stores(t, k);
      e.starts(t, k + 1);
    }
    assert.ok(slowFeeder(t), 't rides');
    e.scheduling.tick();
    assert.deepEqual(e.lastParents(a), ['seed'], 'a took its place under the seed');
    assert.ok(!t.children.has(a));
    assert.equal(graphHasCycle(e.task), false);
  });
});

/**
 * A seed reading the origin at a node's pace, and a chain of five nodes under it, every piece at
 * that pace for three pieces: nothing measured says whether the seed can feed a second chain.
 * With `seedFeedsOne`, the seed announces an upload limit of one chain's pace.
 */
function oneChainUnderASeed({ pieces = PIECES, seedFeedsOne = false } = {}) {
  const e = engine({}, pieces);
  const seed = e.join('seed', { seed: true, ...(seedFeedsOne ? { uploadBandwidth: (PIECE / FAST) * 1000 } : {}) });
  e.starts(seed, 0);
  const join = (id: string) => {
    const peer = e.join(id);
    e.starts(peer, 0);
    return peer;
  };
  const [a, b, c] = [join('a'), join('b'), join('c')];
  const chain = [a, b, c, join('d'), join('f')];
  assert.deepEqual(
    chain.map((p) => e.lastParents(p)),
    [['seed'], ['a'], ['b'], ['c'], ['d']],
    'one chain to begin with',
  );
  for (let k = 0; k < 3; k++) {
    e.at(1_000 + (k + 1) * FAST);
    e.stores(seed, k, 0);
    e.starts(seed, k + 1);
    for (const peer of chain) e.stores(peer, k);
    for (const peer of chain) e.starts(peer, k + 1);
  }
  return { e, seed, chain, a, b, c };
}

/**
 * Pieces `from`… arrive at every chain peer one per `perPiece` ms, from whatever parent each has,
 * while the seed keeps its pace, and so do the peers in `keepPace` (fed by the seed).
 */
function flow(setup: ReturnType<typeof oneChainUnderASeed>, from: number, pieces: number, perPiece: number, keepPace: Peer[] = []) {
  const { e, seed, chain } = setup;
  const start = e.now();
  for (let k = from; k < from + pieces; k++) {
    const at = start + (k - from + 1) * perPiece;
    // The seed's origin stream keeps a node's pace, whatever its children take.
    for (let s = seed.pieces.size; s < e.pieces && 1_000 + (s + 1) * FAST <= at; s++) {
      e.at(1_000 + (s + 1) * FAST);
      e.stores(seed, s, 0);
      if (s + 1 < e.pieces) e.starts(seed, s + 1);
      for (const peer of keepPace) {
        e.stores(peer, s);
        if (s + 1 < e.pieces) e.starts(peer, s + 1);
      }
    }
    e.at(at);
    const paced = chain.filter((peer) => !keepPace.includes(peer));
    for (const peer of paced) e.stores(peer, k);
    for (const peer of paced) e.starts(peer, k + 1);
  }
}

describe('adaptive shape: a seed learns its room by using it', () => {
  it('a seed whose one chain keeps its pace tries the middle of that chain as a second chain', () => {
    const setup = oneChainUnderASeed();
    assert.deepEqual(setup.e.lastParents(setup.c), ['seed'], 'c, the middle of a → b → c → d → f, is tried under the seed');
    assert.deepEqual(setup.e.lastParents(setup.a), ['seed']);
  });

  it('keeps the second chain when both then take the seed’s full pace', () => {
    const setup = oneChainUnderASeed();
    flow(setup, 3, 10, FAST);
    assert.deepEqual(setup.e.lastParents(setup.c), ['seed'], 'c stays: the seed fed two chains at its pace');
    assert.equal(setup.seed.host.links.upCap, undefined);
  });

  it('puts the chain back and marks the upload full when the two chains only share what one took', () => {
    const setup = oneChainUnderASeed();
    flow(setup, 3, 6, 2 * FAST);
    assert.deepEqual(setup.e.lastParents(setup.c), ['b'], 'c goes back under b: the seed had no room');
    const full = setup.seed.host.links.upCap;
    assert.ok(full !== undefined && full < (1.3 * PIECE) / FAST, `the seed's upload is marked full at about one chain (${full})`);
  });

  it('puts the chain back when the seed has room for one and a half: two chains would each get three quarters', () => {
    const setup = oneChainUnderASeed();
    flow(setup, 3, 8, (4 / 3) * FAST);
    assert.deepEqual(setup.e.lastParents(setup.c), ['b']);
    assert.notEqual(setup.seed.host.links.upCap, undefined);
  });
});

describe('adaptive shape: a node learns its room by using it', () => {
  const LONG = 128;

  it('a node whose chain keeps its pace tries the middle of the chain below it, the seed being full', () => {
    const setup = oneChainUnderASeed({ pieces: LONG, seedFeedsOne: true });
    assert.deepEqual(setup.e.lastParents(setup.a), ['seed'], 'the seed announced room for one chain');
    assert.deepEqual(setup.e.lastParents(setup.c), ['a'], 'c, the middle of b → c → d → f below a, is tried under a');
  });

  it('keeps the second chain when both then take the node’s full pace', () => {
    const setup = oneChainUnderASeed({ pieces: LONG, seedFeedsOne: true });
    flow(setup, 3, 10, FAST, [setup.a]);
    assert.deepEqual(setup.e.lastParents(setup.c), ['a'], 'c stays: a fed two chains at its pace');
    assert.equal(setup.a.host.links.upCap, undefined);
  });

  it('puts the chain back and marks the node’s upload full when the two chains only share what one took', () => {
    const setup = oneChainUnderASeed({ pieces: LONG, seedFeedsOne: true });
    // The two chains get half of a's pace each until the trial is judged (eight of a's piece times).
    for (let k = 3; setup.e.task.adaptive.roomTrials.has(setup.a) && k < 20; k++) flow(setup, k, 1, 2 * FAST, [setup.a]);
    assert.deepEqual(setup.e.lastParents(setup.c), ['b'], 'c goes back under b');
    assert.notEqual(setup.a.host.links.upCap, undefined, "a's upload is marked full");
  });

  it('a node whose upload is found full far below what a node was seen to receive rides, and its chain goes to its parent', () => {
    const setup = oneChainUnderASeed({ pieces: LONG, seedFeedsOne: true });
    const { e, a, b, chain } = setup;
    assert.deepEqual(e.lastParents(setup.c), ['a'], 'a tries a second chain');
    // z catches up from a parent ahead of it at four times the chain's pace: the reference rises.
    const z = e.join('z');
    for (let k = 0; k < 3; k++) {
      e.starts(z, k);
      e.at(e.now() + FAST / 4);
      e.stores(z, k);
    }
    assert.ok(
      e.task.adaptive.referenceRate > (3 * PIECE) / FAST,
      `the reference is far above the chain's pace (${e.task.adaptive.referenceRate})`,
    );
    let k = 3;
    for (; e.task.adaptive.roomTrials.has(a) && k < 20; k++) flow(setup, k, 1, 2 * FAST, [a]);
    assert.notEqual(a.host.links.upCap, undefined, "a's upload is marked full");
    assert.ok(slowFeeder(a), 'at about one chain, far below the reference: a rides');
    // The next pieces' reports are checked: a still feeds b's chain.
    flow(setup, k, 1, FAST, [a]);
    assert.deepEqual(e.lastParents(b), ['seed'], 'b took its chain slot under the seed');
    assert.deepEqual(chainChildren(a), [], 'a feeds no chain');
    assert.ok(chain.every((peer) => e.lastParents(peer)?.[0] !== 'a' || slowFeeder(peer)));
    assert.equal(graphHasCycle(e.task), false);
  });

  it('a chain child put back after a trial does not go under its old parent if that parent rides now', () => {
    const setup = oneChainUnderASeed({ pieces: LONG, seedFeedsOne: true });
    const { e, a, b, c } = setup;
    assert.deepEqual(e.lastParents(c), ['a'], 'c, from under b, is tried under a');
    // Meanwhile b's host announces an upload limit of a tenth of the chain's pace: it rides.
    e.scheduling.announceHost(host('b', { uploadBandwidth: (PIECE / FAST) * 100 }));
    assert.ok(slowFeeder(b));
    for (let k = 3; e.task.adaptive.roomTrials.has(a) && k < 20; k++) flow(setup, k, 1, 2 * FAST, [a]);
    assert.notEqual(a.host.links.upCap, undefined, "the trial failed: a's upload is marked full");
    const parent = c.parents[0];
    assert.ok(parent && parent !== b && !slowFeeder(parent), `c went to a chain feeder, not back under b (${parent?.id})`);
    assert.equal(graphHasCycle(e.task), false);
  });

  it('a short pull does not pay for a node’s trial', () => {
    const setup = oneChainUnderASeed({ pieces: PIECES, seedFeedsOne: true });
    assert.deepEqual(
      setup.chain.map((p) => setup.e.lastParents(p)),
      [['seed'], ['a'], ['b'], ['c'], ['d']],
      '16 pieces: a failed trial would cost the chain below a fraction of its pull',
    );
  });
});

describe('adaptive shape: a parent feeding more chains than its upload carries', () => {
  const PACE = PIECE / FAST;

  /**
   * A seed whose upload carries two nodes' pace feeds four chains (seed → a → a2, b → b2, c → c2,
   * d → d2), each head receiving `share` of a node's pace (d a little less), the ends as fast as
   * their heads; below a2, q was measured at a node's pace (the reference).
   */
  function fourChains(upload = 2 * PACE, share = 0.5) {
    const e = engine({ pipeline: { fanout: 1, seedFanout: 4 } });
    const seed = e.join('seed', { seed: true }, all(PIECES));
    seed.host.links.foundUploadFull(upload);
    const a = e.join('a');
    const b = e.join('b');
    const c = e.join('c');
    const d = e.join('d');
    const heads: Array<[Peer, number]> = [
      [a, share],
      [b, share],
      [c, share],
      [d, 0.9 * share],
    ];
    for (const [head] of heads) e.starts(head, 0);
    const ends = heads.map(([head]) => [e.join(`${head.id.split('|')[0]}2`), head] as const);
    assert.deepEqual(
      [...heads.map(([head]) => head), ...ends.map(([end]) => end)].map((peer) => e.lastParents(peer)),
      [['seed'], ['seed'], ['seed'], ['seed'], ['a'], ['b'], ['c'], ['d']],
      'four chains of two',
    );
    for (const [head, rate] of heads) head.pace.lastPieceRate = rate * PACE;
    for (const [end, head] of ends) {
      e.starts(end, 0);
      end.pace.lastPieceRate = head.pace.lastPieceRate;
    }
    // q, below a2, was measured at a node's full pace (it had a chain to itself): the reference.
    const q = e.join('q');
    assert.deepEqual(e.lastParents(q), ['a2']);
    q.pace.lastPieceRate = PACE;
    e.task.adaptive.referenceRate = PACE;
    e.task.adaptive.referenceConfirmed = true;
    return { e, seed, a, b, c, d, q };
  }

  it('sheds its slowest chain below the end of another, the fastest end first', () => {
    const { seed, d } = fourChains();
    const merge = chainToMerge(seed);
    assert.equal(merge?.child, d, 'd receives least');
    assert.deepEqual(
      merge?.ends.map((end) => end.id.split('|')[0]),
      ['q', 'b2', 'c2'],
      "not d's own end (a cycle), nor a2, which feeds q",
    );
  });

  it('on the periodic pass, the chain moves and the seed feeds one chain fewer', () => {
    const { e, seed, d } = fourChains();
    e.scheduling.tick();
    assert.deepEqual(e.lastParents(d), ['q']);
    assert.equal(chainChildren(seed).length, 3);
    assert.equal(graphHasCycle(e.task), false);
  });

  it('keeps its chains while its upload carries each at SLOW of the pace, or while they do not take it whole', () => {
    assert.equal(chainToMerge(fourChains(4 * PACE, 1).seed), undefined, 'four chains at a node’s pace each');
    assert.equal(chainToMerge(fourChains(2 * PACE, 0.25).seed), undefined, 'they take half its upload: something else holds them');
  });
});

describe('adaptive shape: a passenger rides where it can show more than its cap', () => {
  it('fits a parent with spare beyond its cap by the clearing margin and SLOW, and moves off one that has less', () => {
    const e = engine();
    e.join('seed', { seed: true }, all(PIECES));
    e.task.adaptive.referenceRate = PIECE / FAST;
    const rider = e.join('r');
    const cap = (0.2 * PIECE) / FAST;
    rider.host.links.capDownload(cap, 'seed');
    assert.ok(passengerCap(rider) !== undefined, 'r rides as a passenger');
    const end = e.join('end');
    end.pace.lastPieceRate = 1.9 * cap;
    assert.equal(riderFits(end, rider), false, 'at 1.9 times its cap, what r got would not clear a cap found too low');
    end.pace.lastPieceRate = 2.1 * cap;
    assert.equal(riderFits(end, rider), true);
    end.pace.lastPieceRate = 1.5 * cap;
    assert.equal(misplaced(rider, end), true, 'its parent slowed: it looks for another');
    // A passenger at 0.6 of the reference would need 1.2 of it: SLOW of the reference is asked at most.
    rider.host.links.downCap = (0.6 * PIECE) / FAST;
    end.pace.lastPieceRate = (0.75 * PIECE) / FAST;
    assert.equal(riderFits(end, rider), true, 'a parent with three quarters of the reference to spare takes it');
  });
});

describe('adaptive shape: a seed probing whether every node is slow', () => {
  const PACE = PIECE / FAST;

  /**
   * A seed reading the origin at eight nodes' pace feeds `heads` chains of two (seed → h0 → h0e,
   * …), taken by its room before anything was measured; h0 was then found slow against it, the
   * reference not yet confirmed.
   */
  function seedWithChains(heads: number) {
    const e = engine({ pipeline: { fanout: 1, seedFanout: heads } });
    const seed = e.join('seed', { seed: true }, all(PIECES));
    const firsts = all(heads).map((i) => e.join(`h${i}`));
    for (const head of firsts) e.starts(head, 0);
    for (const i of all(heads)) e.starts(e.join(`h${i}e`), 0);
    assert.deepEqual(
      firsts.map((head) => e.lastParents(head)),
      firsts.map(() => ['seed']),
      'every head under the seed',
    );
    seed.host.links.sawIntake(8 * PACE);
    const slow = firsts[0];
    assert.ok(slow);
    slow.host.links.capDownload(PACE / 4, seed.host.id);
    assert.equal(e.task.adaptive.referenceConfirmed, false);
    return { seed };
  }

  it('probes with chain ends while it feeds one chain: each shows what a node receives', () => {
    const { seed } = seedWithChains(1);
    assert.equal(probeTargets(seed).length, 1, 'its one chain has one end');
  });

  it('counts the chains it took by its room as probes: with three, it probes once more; with four, not at all', () => {
    assert.equal(probeTargets(seedWithChains(3).seed).length, 1);
    assert.deepEqual(probeTargets(seedWithChains(4).seed), []);
  });
});
