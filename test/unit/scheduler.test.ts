import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { silentLogger } from '../../src/common/log.js';
import { hostInfo as host } from '../fixtures/host-info.js';
import type { HostInfo, PieceFinished, SchedulerPacket } from '../../src/rpc/scheduler-api.js';
import { formatIssues } from '../../src/common/config.js';
import { defaultScheduling, schedulingSchema, type SchedulingConfig } from '../../src/scheduler/config.js';
import { PieceSet } from '../../src/scheduler/piece-set.js';
import { graphHasCycle, GROWING_TTL_MS, Resources, type Peer } from '../../src/scheduler/resources.js';
import { ON_DEMAND_QUIET_MS } from '../../src/scheduler/on-demand-reading.js';
import { Scheduling } from '../../src/scheduler/scheduling.js';
import { filterCandidates, keepsItsParents, type Exclusion } from '../../src/scheduler/selection.js';
import { itemAt } from '../../src/common/indexing.js';

const TASK = `sha256:${'a'.repeat(64)}`;
const REGISTRY = 'http://registry';
const PIECE = 4 * 1024 * 1024;

/**
 * The mesh's configuration, which these tests were written for (the default is the adaptive
 * shape: test/unit/adaptive.test.ts).
 */
const meshConfig = (): SchedulingConfig => ({ ...defaultScheduling(), shape: 'mesh' });

/** A scheduling engine with a hand-driven clock, recording every packet and seed trigger. */
function engine(config: Partial<SchedulingConfig> = {}, seedTriggerFails = false) {
  let now = 1_000;
  const packets = new Map<string, SchedulerPacket[]>();
  const triggers: string[] = [];
  const disconnected: Array<{ peer: string; reason: string }> = [];
  const scheduling = new Scheduling(
    new Resources(),
    { ...meshConfig(), ...config },
    {
      now: () => now,
      triggerSeed: async (seed) => {
        triggers.push(seed.id);
        if (seedTriggerFails) throw new Error('seed refused');
      },
    },
    silentLogger,
  );
  const join = (
    hostId: string,
    info: Partial<HostInfo> = {},
    pieces: number[] = [],
    size = 10 * PIECE,
    peerId?: string,
    origin = { url: `${REGISTRY}/v2/x/blobs/${TASK}`, public: true },
  ) => {
    if (!scheduling.resources.hosts.has(hostId)) scheduling.announceHost(host(hostId, info));
    const id = peerId ?? `${hostId}|${TASK}`;
    const received: SchedulerPacket[] = [];
    packets.set(id, received);
    return scheduling.register(
      { peerId: id, hostId, taskId: TASK, contentLength: size, pieceSize: PIECE, origin, heldPieces: pieces },
      (packet) => received.push(packet),
      (reason) => disconnected.push({ peer: id, reason }),
    );
  };
  const last = (peer: Peer) => packets.get(peer.id)?.at(-1);
  /** Every piece's digest vouched for, as if a seed had read the whole blob. */
  const vouch = (pieces = 10) => {
    const task = scheduling.resources.task(TASK, pieces * PIECE, PIECE, now, REGISTRY);
    for (let index = 0; index < pieces; index++) scheduling.learnDigest(task, index, digest(index));
  };
  return { scheduling, join, last, packets, disconnected, triggers, vouch, now: () => now, advance: (ms: number) => (now += ms) };
}

const all = (n: number) => [...Array(n).keys()];
const digest = (i: number) => `sha256:${i.toString(16).padStart(64, '0')}`;

describe('scheduling: who reads the origin', () => {
  it('sends a seed that registers for a task to the origin, and hands it out as a parent without another trigger', () => {
    const { join, last, triggers } = engine();
    const seed = join('seed-1', { seed: true }, [], 10 * PIECE);
    assert.equal(last(seed)?.packet, 'backToSource');
    const child = join('node-1');
    const packet = last(child);
    assert.deepEqual(packet?.packet === 'parents' && packet.parents.parents.map((p) => p.peerId), [seed.id]);
    assert.deepEqual(triggers, []);
  });

  it('sends the first peer to the origin when there is no seed, and makes the next one wait', () => {
    const { join, last } = engine({ backToSourceLimit: 1 });
    const first = join('node-1');
    assert.equal(last(first)?.packet, 'backToSource');
    const second = join('node-2');
    assert.equal(last(second)?.packet, 'wait');
  });

  it('triggers the seed for a child, then hands the seed out as a parent as soon as it reads the origin (it fetches what children ask)', () => {
    const { scheduling, join, last, triggers } = engine();
    scheduling.announceHost(host('seed-1', { seed: true }));
    const child = join('node-1');
    assert.deepEqual(triggers, ['seed-1']);
    assert.equal(last(child)?.packet, 'wait');
    // The seed holds nothing yet: it reads from the origin the pieces its children ask for.
    const seed = join('seed-1', { seed: true });
    assert.equal(last(seed)?.packet, 'backToSource');
    const packet = last(child);
    assert.equal(packet?.packet, 'parents');
    assert.deepEqual(packet?.packet === 'parents' && packet.parents.parents.map((p) => p.peerId), [seed.id]);
  });

  it('trusts piece digests only from peers it sent to the origin, and spreads them', () => {
    const { scheduling, join, packets } = engine();
    const reader = join('node-1');
    const liar = join('node-2', {}, all(10));
    scheduling.pieceFinished(liar, { index: 3, digest: digest(99), parentId: '', costMs: 1, fromOrigin: true, length: PIECE });
    assert.equal(reader.task.digests.size, 0, 'a peer not sent to the origin is not believed');
    scheduling.pieceFinished(reader, { index: 3, digest: digest(3), parentId: '', costMs: 1, fromOrigin: true, length: PIECE });
    assert.equal(reader.task.digests.get(3), digest(3));
    scheduling.pieceFinished(reader, { index: 3, digest: digest(4), parentId: '', costMs: 1, fromOrigin: true, length: PIECE });
    assert.equal(reader.task.digests.get(3), digest(3), 'the first digest stays');
    const late = join('node-3');
    assert.deepEqual(packets.get(late.id)?.[0], { packet: 'digests', digests: { digests: { 3: digest(3) } } });
  });

  it("confirms piece digests when a peer's whole blob verifies, overruling an origin reader's lie, and tells every peer", () => {
    const { scheduling, join, packets } = engine();
    const reader = join('node-1');
    const lie = digest(77);
    scheduling.pieceFinished(reader, { index: 0, digest: lie, parentId: '', costMs: 1, fromOrigin: true, length: PIECE });
    scheduling.pieceFinished(reader, { index: 1, digest: digest(1), parentId: '', costMs: 1, fromOrigin: true, length: PIECE });
    const waiting = join('node-2');
    assert.deepEqual(packets.get(waiting.id)?.[0], { packet: 'digests', digests: { digests: { 0: lie, 1: digest(1) } } });
    // A restarted holder says it finished without reporting digests: nothing of its is confirmed.
    const restarted = join('node-3', {}, all(10));
    scheduling.finished(restarted);
    assert.equal(reader.task.confirmed.size, 0, 'a blob held since before a restart confirms no digest it never reported');
    // node-4 read the whole blob itself (not sent to the origin: not believed as it went), and it verified.
    const verifier = join('node-4');
    for (let index = 0; index < 10; index++) {
      scheduling.pieceFinished(verifier, { index, digest: digest(index), parentId: '', costMs: 1, fromOrigin: true, length: PIECE });
    }
    assert.equal(reader.task.digests.get(0), lie, 'still the registry word of the origin reader');
    scheduling.finished(verifier);
    assert.equal(reader.task.digests.get(0), digest(0), 'the verified blob overrules the lie');
    assert.equal(reader.task.confirmed.size, 10);
    const confirmed = packets.get(waiting.id)?.at(-1);
    assert.ok(confirmed?.packet === 'digests' && confirmed.digests.confirmed, 'the waiting peer hears the confirmed digests');
    assert.equal(confirmed.digests.digests[0], digest(0));
    const late = join('node-5');
    assert.deepEqual(packets.get(late.id)?.[0], {
      packet: 'digests',
      digests: { digests: Object.fromEntries(all(10).map((i) => [i, digest(i)])), confirmed: true },
    });
  });

  it("forgets the digests not confirmed when a peer's blob fails its digest, tells the peers, and may trigger the seed again", () => {
    const { scheduling, join, packets, triggers } = engine();
    scheduling.announceHost(host('seed-1', { seed: true }));
    const child = join('node-1');
    assert.deepEqual(triggers, ['seed-1']);
    const seed = join('seed-1', { seed: true });
    scheduling.pieceFinished(seed, { index: 2, digest: digest(66), parentId: '', costMs: 1, fromOrigin: true, length: PIECE });
    assert.equal(child.task.digests.size, 1);
    scheduling.contentMismatch(seed);
    scheduling.leave(seed);
    assert.equal(child.task.digests.size, 0, 'the vouched-for digest is forgotten');
    assert.ok(
      packets.get(child.id)?.some((p) => p.packet === 'digests' && p.digests.forgetVouched),
      'the peer is told to forget them too',
    );
    join('node-2');
    assert.deepEqual(triggers, ['seed-1', 'seed-1'], 'the seed is asked again for the next reader');
  });

  it('sends a peer to the origin after R fruitless rounds whatever the limit', () => {
    const { scheduling, join, last } = engine({ backToSourceLimit: 1, retryLimit: 3 });
    join('node-1'); // the one origin reader, which never reports a piece
    const waiting = join('node-2');
    for (let round = 0; round < 2; round++) scheduling.tick();
    assert.equal(last(waiting)?.packet, 'wait');
    scheduling.tick();
    assert.equal(last(waiting)?.packet, 'backToSource');
  });

  it('keeps a peer waiting, not at the origin, while the only holders are full', () => {
    const e = engine({ backToSourceLimit: 1, retryLimit: 3 });
    e.vouch();
    const full = e.join('node-1', { uploadSlots: 1 }, all(10));
    const first = e.join('node-2');
    assert.deepEqual(
      first.parents.map((p) => p.id),
      [full.id],
      'takes the one slot',
    );
    const waiting = e.join('node-3');
    for (let round = 0; round < 10; round++) e.scheduling.tick();
    assert.equal(e.last(waiting)?.packet, 'wait', 'ten rounds with a full holder are not fruitless');
    e.scheduling.finished(first);
    e.scheduling.tick();
    assert.equal(e.last(waiting)?.packet, 'parents', 'served once a holder has room');
  });

  it('tells a waiting peer the seeds reading the origin, to read spans from meanwhile', () => {
    const e = engine({ pipeline: { fanout: 1, seedFanout: 1 }, shape: 'pipeline' });
    const seed = e.join('seed-1', { seed: true });
    assert.equal(e.last(seed)?.packet, 'backToSource', 'the seed reads the origin');
    const first = e.join('node-1');
    assert.deepEqual(
      first.parents.map((p) => p.id),
      [seed.id],
      'takes the seed',
    );
    const waiting = e.join('node-2');
    const told = e.last(waiting);
    assert.equal(told?.packet, 'wait', "the seed's one chain is taken");
    assert.deepEqual(told?.packet === 'wait' ? told.wait.spanSources?.map((p) => [p.peerId, p.seed]) : undefined, [[seed.id, true]]);
  });

  it("never asks a seed for a private blob: the peer holding its client's credentials reads the origin itself", () => {
    const e = engine();
    e.scheduling.announceHost(host('seed', { seed: true }));
    const child = e.join('node-1', {}, [], 10 * PIECE, undefined, { url: `${REGISTRY}/v2/x/blobs/${TASK}`, public: false });
    assert.deepEqual(e.triggers, [], 'no seed triggered');
    assert.equal(e.last(child)?.packet, 'backToSource');
  });

  it('keeps peers of different origin registries in different tasks: piece digests never cross registries', () => {
    const e = engine();
    const honest = e.join('node-1');
    e.scheduling.pieceFinished(honest, { index: 0, digest: digest(0), parentId: '', costMs: 1, fromOrigin: true, length: PIECE });
    const other = e.join('node-2', {}, [], 10 * PIECE, undefined, { url: `http://elsewhere/v2/x/blobs/${TASK}`, public: true });
    assert.notEqual(other.task, honest.task);
    assert.equal(other.task.digests.size, 0, "the honest registry's digests are not handed to a reader of another registry");
    assert.equal(e.scheduling.stat(TASK, 'http://elsewhere')?.registry, 'http://elsewhere');
  });

  it('lets others read the origin when a triggered seed refuses', async () => {
    const { scheduling, join, last } = engine({}, true);
    scheduling.announceHost(host('seed-1', { seed: true }));
    const child = join('node-1');
    assert.equal(last(child)?.packet, 'wait');
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(last(child)?.packet, 'backToSource');
  });
});

describe('scheduling: parent selection', () => {
  /** A peer holding `pieces`, on a task whose digests are all known (so holders are useful parents). */
  function holder(e: ReturnType<typeof engine>, id: string, info: Partial<HostInfo> = {}, pieces = all(10)) {
    e.vouch();
    return e.join(id, info, pieces);
  }

  it('filters out its own host, blocklisted peers, peers with nothing to offer, cycles and overloaded hosts', () => {
    const e = engine();
    const good = holder(e, 'node-1');
    const fresh = e.join('node-2', {}, []);
    const useless = e.join('node-3', {}, [0]);
    const blocked = holder(e, 'node-4');
    const overloaded = holder(e, 'node-5', { uploadSlots: 1 });
    const busy = e.join('node-6', {}, []);
    busy.parents = [overloaded];
    overloaded.children.add(busy);
    const me = e.join('node-7', {}, [0]);
    const sameHost = e.join('node-7', {}, all(10), 10 * PIECE, 'node-7|other-daemon');
    const downstream = holder(e, 'node-8');
    downstream.parents = [me];
    me.children.add(downstream);
    me.blocklist.add(blocked.id);
    const excluded = new Map<string, Exclusion>();
    const candidates = filterCandidates(me, meshConfig(), 0, excluded);
    assert.deepEqual(
      candidates.map((p) => p.id),
      [good.id],
    );
    assert.equal(excluded.get(fresh.id), 'nothing-to-offer');
    assert.equal(excluded.get(useless.id), 'nothing-to-offer');
    assert.equal(excluded.get(blocked.id), 'blocklisted');
    assert.equal(excluded.get(overloaded.id), 'overloaded');
    assert.equal(excluded.get(sameHost.id), 'same-host');
    assert.equal(excluded.get(downstream.id), 'cycle');
  });

  it("a child that says it is idle (a lazy reader served) gives its parent's upload slot to a waiting child, and gets parents again when it asks", () => {
    const e = engine();
    const seed = holder(e, 'seed-1', { seed: true, uploadSlots: 1 });
    const reader = e.join('node-1', {}, [9]);
    assert.deepEqual(
      reader.parents.map((p) => p.id),
      [seed.id],
    );
    // It holds what the reader holds: only the seed, whose one slot is taken, could serve it.
    const other = e.join('node-2', {}, [9]);
    assert.equal(e.last(other)?.packet, 'wait', "the seed's one slot is taken");
    e.scheduling.idle(reader);
    assert.equal(reader.parents.length, 0, 'the idle child holds no parent');
    assert.deepEqual(e.last(reader), { packet: 'parents', parents: { parents: [] } });
    assert.deepEqual(
      other.parents.map((p) => p.id),
      [seed.id],
      'the waiting child got the freed slot at once',
    );
    e.scheduling.tick();
    assert.equal(reader.parents.length, 0, 'the periodic pass leaves an idle child alone');
    e.scheduling.finished(other);
    e.scheduling.reschedule(reader, []);
    assert.deepEqual(reader.parents.map((p) => p.id).sort(), [other.id, seed.id].sort(), 'asking again brings parents');
    assert.equal(reader.fruitlessRounds, 0, 'waking up is no fruitless round');
  });

  it('offers a peer as a parent once a piece starts arriving at it, until the report goes stale', () => {
    const e = engine();
    e.vouch();
    const relay = e.join('relay', {}, []);
    const child = e.join('child', {}, []);
    const candidates = () => filterCandidates(child, meshConfig(), e.now(), new Map()).map((p) => p.id);
    assert.deepEqual(candidates(), [], 'nothing stored, nothing arriving');
    e.scheduling.pieceStarted(relay, 3);
    assert.deepEqual(candidates(), [relay.id], 'it relays piece 3 as it arrives');
    assert.equal(e.last(child)?.packet, 'parents', 'the waiting child was scheduled at once');
    e.scheduling.pieceStarted(relay, 99); // out of range: ignored
    assert.equal(relay.growing.size, 1);
    e.advance(GROWING_TTL_MS + 1);
    assert.deepEqual(candidates(), [], 'a start never followed by the piece goes stale');
    e.scheduling.pieceStarted(relay, 4);
    e.scheduling.pieceFinished(relay, { index: 4, digest: '', parentId: '', costMs: 1, fromOrigin: false, length: PIECE });
    assert.equal(relay.growing.size, 0, 'a stored piece is no longer arriving');
  });

  it('does not count a piece the child is already receiving as something a parent offers', () => {
    const e = engine();
    e.vouch();
    const holder = e.join('holder', {}, [0, 1]);
    const relay = e.join('relay', {}, []);
    const child = e.join('child', {}, [0]);
    const excluded = new Map<string, Exclusion>();
    const candidates = () => filterCandidates(child, meshConfig(), e.now(), excluded).map((p) => p.id);
    e.scheduling.pieceStarted(relay, 1);
    assert.deepEqual(candidates().sort(), [holder.id, relay.id].sort(), 'both have piece 1, which the child lacks');
    e.scheduling.pieceStarted(child, 1);
    assert.deepEqual(candidates(), [], 'piece 1 is on its way to the child: neither offers anything more');
    assert.equal(excluded.get(holder.id), 'nothing-to-offer');
    assert.equal(excluded.get(relay.id), 'nothing-to-offer');
    e.advance(GROWING_TTL_MS + 1);
    assert.deepEqual(candidates(), [holder.id], "a start never followed by the piece goes stale (the relay's too)");
    e.scheduling.pieceFinished(child, { index: 1, digest: '', parentId: holder.id, costMs: 1, fromOrigin: false, length: PIECE });
    assert.deepEqual(candidates(), [], 'the child holds what the holder has');
  });

  it('schedules no more waiting peers at a first piece start than the new holder has room for', () => {
    const e = engine();
    e.vouch();
    const relay = e.join('relay', { uploadSlots: 1 }, []);
    const waiting = ['w1', 'w2', 'w3'].map((id) => e.join(id, {}, []));
    // Every peer also hears that the swarm now reads on demand (SwarmReading): not a scheduling.
    const sentTo = (peer: Peer) => e.packets.get(peer.id)?.filter((p) => p.packet !== 'swarmReading').length ?? 0;
    const before = waiting.map(sentTo);
    e.scheduling.pieceStarted(relay, 0);
    const scheduled = waiting.filter((peer, i) => sentTo(peer) > itemAt(before, i));
    assert.equal(scheduled.length, 1, 'one slot, one peer scheduled now');
    assert.equal(e.last(itemAt(scheduled, 0))?.packet, 'parents');
  });

  it('leaves out slow outliers', () => {
    const e = engine();
    const child = e.join('child', {}, []);
    const parents = ['p1', 'p2', 'p3', 'p4'].map((id) => holder(e, id));
    parents.forEach((p, i) => (p.costPerMiB = i === 3 ? 500 : 10));
    const excluded = new Map<string, Exclusion>();
    const kept = filterCandidates(child, meshConfig(), 0, excluded);
    assert.equal(excluded.get(itemAt(parents, 3).id), 'slow');
    assert.equal(kept.length, 3);
  });

  it('never crosses a strict zone while a same-zone candidate exists, and prefers the same rack', () => {
    const e = engine({ candidateParentLimit: 2 });
    const a1 = holder(e, 'a1', { labels: { zone: 'a', rack: 'r1' } });
    const a2 = holder(e, 'a2', { labels: { zone: 'a', rack: 'r2' } });
    holder(e, 'b1', { labels: { zone: 'b', rack: 'r1' } });
    const child = e.join('a3', { labels: { zone: 'a', rack: 'r2' } }, []);
    assert.deepEqual(
      child.parents.map((p) => p.id),
      [a2.id, a1.id],
    );
    const lonely = e.join('c1', { labels: { zone: 'c' } }, []);
    assert.equal(lonely.parents.length, 2, 'no same-zone candidate: crossing is allowed');
  });

  it('keeps the parent graph acyclic while peers exchange pieces', () => {
    const e = engine({ candidateParentLimit: 3 });
    const seed = e.join('seed', { seed: true });
    assert.equal(e.last(seed)?.packet, 'backToSource');
    const peers = ['n1', 'n2', 'n3', 'n4', 'n5'].map((id) => e.join(id));
    for (let index = 0; index < 10; index++) {
      e.scheduling.pieceFinished(seed, { index, digest: digest(index), parentId: '', costMs: 1, fromOrigin: true, length: PIECE });
      for (const [i, peer] of peers.entries()) {
        if ((index + i) % 2 === 0)
          e.scheduling.pieceFinished(peer, {
            index,
            digest: digest(index),
            parentId: seed.id,
            costMs: 1,
            fromOrigin: false,
            length: PIECE,
          });
      }
      e.scheduling.tick();
      assert.ok(!graphHasCycle(seed.task), `no cycle after piece ${index} (checked over the whole graph)`);
    }
    assert.equal(seed.task.cyclesDetected, 0);
    for (const peer of peers) assert.ok(peer.parents.every((p) => p.host !== peer.host));
  });

  it("a registration's old stream closing after the peer registered again (a restart) leaves the new registration alone", () => {
    const { scheduling, join } = engine();
    const before = join('h1', {}, all(10));
    scheduling.finished(before);
    const again = join('h1', {}, all(10)); // the restarted peer, same id, on a new stream
    scheduling.finished(again);
    scheduling.leave(before); // the old stream's close, processed late
    const stat = scheduling.stat(TASK, REGISTRY);
    assert.deepEqual(
      stat?.peers.map((peer) => [peer.peerId, peer.finished]),
      [[again.id, true]],
      'the restarted peer still offers the blob',
    );
    assert.ok(scheduling.resources.hosts.get('h1')?.peers.has(again));
  });

  it('blocklists a parent that served a bad piece and finds another', () => {
    const e = engine();
    const bad = holder(e, 'bad');
    const good = holder(e, 'good');
    const child = e.join('child', {}, []);
    assert.ok(child.parents.includes(bad));
    e.scheduling.pieceFailed(child, { index: 0, parentId: bad.id, reason: 'FAILURE_REASON_BAD_PIECE', message: 'digest mismatch' });
    assert.ok(child.blocklist.has(bad.id));
    assert.deepEqual(child.parents, [good]);
    assert.equal(bad.recentFailures(2_000), 1);
  });

  it('reschedules the children of a peer that leaves', () => {
    const e = engine({ candidateParentLimit: 1 });
    const first = holder(e, 'p1');
    const child = e.join('child', {}, []);
    const other = holder(e, 'p2');
    assert.deepEqual(child.parents, [first]);
    e.scheduling.leave(first);
    assert.deepEqual(child.parents, [other]);
  });

  it("drops hosts that stop announcing themselves, and ends their peers' streams so that they register again", () => {
    const e = engine();
    const silent = holder(e, 'p1');
    e.advance(20_000);
    const live = holder(e, 'p2');
    const expired = e.scheduling.expireHosts(15_000);
    assert.deepEqual(
      expired.map((h) => h.id),
      ['p1'],
    );
    assert.deepEqual(
      e.disconnected.map((d) => d.peer),
      [silent.id],
      'only the silent host is told',
    );
    assert.match(itemAt(e.disconnected, 0).reason, /p1 sent no keep-alive for 15000 ms/);
    e.scheduling.leave(live);
    const task = e.scheduling.resources.findTask(TASK);
    assert.ok(task, 'the task is kept');
    assert.equal(task.peers.size, 0);
    assert.equal(task.digests.size, 10, 'an empty task keeps its digests for a while');
    e.advance(60_000);
    assert.equal(e.scheduling.expireTasks(30_000), 1);
    assert.equal(e.scheduling.resources.findTask(TASK), undefined);
  });

  it('lets the periodic pass skip a child whose full set of parents still serves it, and only that child', () => {
    const e = engine({ candidateParentLimit: 2 });
    e.vouch();
    const zoned = (zone: string) => ({ labels: { zone } });
    const a = e.join('a', zoned('z1'), all(10));
    const b = e.join('b', zoned('z1'), all(10));
    const child = e.join('child', zoned('z1'), []);
    const config = e.scheduling.config;
    assert.deepEqual(child.parents.map((p) => p.id).sort(), [a.id, b.id].sort());
    assert.equal(keepsItsParents(child, config, e.now()), true);
    const short = e.join('short', zoned('z1'), []);
    short.parents = [a];
    assert.equal(keepsItsParents(short, config, e.now()), false, 'fewer parents than the limit');
    for (let i = 0; i < 10; i++)
      e.scheduling.pieceFinished(child, { index: i, digest: '', parentId: a.id, costMs: 1, fromOrigin: false, length: PIECE });
    assert.equal(keepsItsParents(child, config, e.now()), false, 'its parents have nothing more for it');
    const across = e.join('across', zoned('z2'), [0]);
    across.parents = [a, b];
    assert.equal(keepsItsParents(across, config, e.now()), false, 'parents across a strict key get another look');
  });

  it('refuses a register that contradicts the task or names an unknown host', () => {
    const e = engine();
    e.join('p1');
    assert.throws(() => e.join('p2', {}, [], 3 * PIECE), /is known with size/);
    assert.throws(
      () =>
        e.scheduling.register(
          { peerId: 'x', hostId: 'ghost', taskId: TASK, contentLength: 1, pieceSize: PIECE, heldPieces: [] },
          () => undefined,
        ),
      /has not announced itself/,
    );
  });
});

describe('scheduling: pipeline shape', () => {
  const pipeline = (fanout = 1, seedFanout = 1): Partial<SchedulingConfig> => ({ shape: 'pipeline', pipeline: { fanout, seedFanout } });
  const parentsOf = (e: ReturnType<typeof engine>, peer: Peer) => {
    const packet = e.last(peer);
    assert.equal(packet?.packet, 'parents', `${peer.id} was given parents`);
    return packet.packet === 'parents' ? packet.parents.parents : [];
  };

  it('chains the peers: one parent each, one piece at a time, at most `fanout` children per peer', () => {
    const e = engine(pipeline());
    e.vouch();
    const seed = e.join('seed', { seed: true }, all(10));
    const chain = [seed];
    for (const name of ['n1', 'n2', 'n3', 'n4']) {
      const peer = e.join(name, {}, []);
      const given = parentsOf(e, peer);
      assert.deepEqual(
        given.map((p) => p.peerId),
        [itemAt(chain, chain.length - 1).id],
        `${name} hangs below the end of the chain`,
      );
      assert.equal(given[0]?.piecesAtOnce, 1);
      // Its first piece starts arriving: it can relay, so the next peer may hang below it.
      e.scheduling.pieceStarted(peer, 0);
      chain.push(peer);
    }
    for (const peer of chain) assert.ok(peer.children.size <= 1, `${peer.id} feeds ${peer.children.size} children`);
  });

  it('lets a seed feed `seedFanout` children and makes the rest wait for a free slot', () => {
    const e = engine(pipeline(1, 2));
    e.vouch();
    const seed = e.join('seed', { seed: true }, all(10));
    const a = e.join('a', {}, []);
    const b = e.join('b', {}, []);
    const c = e.join('c', {}, []);
    assert.deepEqual(
      [a, b].map((p) => p.parents.map((q) => q.id)),
      [[seed.id], [seed.id]],
    );
    assert.equal(e.last(c)?.packet, 'wait', 'the seed is full and nobody else holds anything');
    e.scheduling.pieceStarted(a, 0);
    assert.deepEqual(
      c.parents.map((q) => q.id),
      [a.id],
      'a new holder takes the waiting peer at once',
    );
  });

  it("hangs an orphan below its lost parent's parent when a peer in the middle of a chain leaves", () => {
    const e = engine(pipeline());
    e.vouch();
    const seed = e.join('seed', { seed: true }, all(10));
    const a = e.join('a', {}, [0, 1]);
    const b = e.join('b', {}, [0]);
    assert.deepEqual(
      b.parents.map((p) => p.id),
      [a.id],
    );
    e.scheduling.leave(a);
    assert.deepEqual(
      b.parents.map((p) => p.id),
      [seed.id],
    );
  });

  it('says nothing about pieces at once in a mesh, and hands out several parents', () => {
    const e = engine();
    e.vouch();
    e.join('h1', {}, all(10));
    e.join('h2', {}, all(10));
    const child = e.join('child', {}, []);
    const given = parentsOf(e, child);
    assert.equal(given.length, 2);
    assert.ok(given.every((p) => p.piecesAtOnce === 0));
  });

  it('lets the periodic pass skip a child caught up with a parent that is still downloading, but not in a mesh or once the parent left', () => {
    const e = engine(pipeline());
    e.vouch();
    e.join('seed', { seed: true }, all(10));
    const parent = e.join('parent', {}, [0, 1]);
    const child = e.join('child', {}, [0, 1]);
    child.parents = [parent];
    parent.children.add(child);
    const config = e.scheduling.config;
    e.scheduling.pieceStarted(parent, 2);
    e.scheduling.pieceStarted(child, 2);
    assert.equal(keepsItsParents(child, config, e.now()), true, 'the parent relays piece 2 as it comes and will have more');
    assert.equal(
      filterCandidates(child, config, e.now()).includes(parent),
      false,
      'though a selection would find it has nothing new right now',
    );
    assert.equal(keepsItsParents(child, { ...config, shape: 'mesh', candidateParentLimit: 1 }, e.now()), false, 'a mesh looks again');
    e.scheduling.leave(parent);
    child.parents = [parent];
    assert.equal(keepsItsParents(child, config, e.now()), false, 'a parent that left is replaced');
  });

  for (const shape of ['pipeline', 'adaptive'] as const) {
    it(`moves a child caught up with a lazy reader that wants nothing (idle) to a parent that has more (${shape})`, () => {
      const e = engine(shape === 'pipeline' ? pipeline() : { shape });
      e.vouch();
      const seed = e.join('seed', { seed: true }, all(10));
      const reader = e.join('reader', {}, [0, 3]);
      const child = e.join('child', {}, [0, 3]);
      // The child hangs below the reader alone (whatever the engine chose on the way here).
      const hang = () => {
        for (const parent of child.parents) parent.children.delete(child);
        child.parents = [reader];
        reader.children.add(child);
      };
      hang();
      const config = e.scheduling.config;
      assert.equal(keepsItsParents(child, config, e.now()), true, 'a parent still downloading will have more');
      e.scheduling.idle(reader);
      hang();
      assert.equal(keepsItsParents(child, config, e.now()), false, 'an idle reader gets nothing more: look again');
      e.scheduling.reschedule(child, []);
      assert.deepEqual(
        child.parents.map((p) => p.id),
        [seed.id],
        'the child goes to the peer that has what it lacks',
      );
    });
  }

  it("keeps a child in its zone when its zone's only holder is full: it waits rather than crossing", () => {
    const e = engine(pipeline());
    e.vouch();
    const zone = (name: string) => ({ labels: { zone: name } });
    const holderA = e.join('holder-a', zone('a'), all(10));
    const first = e.join('first-a', zone('a'), []);
    assert.deepEqual(
      first.parents.map((p) => p.id),
      [holderA.id],
    );
    const holderB = e.join('holder-b', zone('b'), all(10));
    const second = e.join('second-a', zone('a'), []);
    const excluded = new Map<string, Exclusion>();
    assert.deepEqual(filterCandidates(second, e.scheduling.config, e.now(), excluded), []);
    assert.equal(excluded.get(holderB.id), 'topology', 'zone b has room, but zone a has a holder');
    assert.equal(excluded.get(holderA.id), 'overloaded');
    assert.equal(e.last(second)?.packet, 'wait');
    // The first child finishes: it and zone a's holder have room again, and the waiting child
    // takes one of them.
    e.scheduling.finished(first);
    e.scheduling.tick();
    assert.equal(second.parents.length, 1);
    assert.equal(second.parents[0]?.host.info.labels.zone, 'a');
  });

  it('rejects an unknown shape or a zero fan-out, naming the key', () => {
    const shape = schedulingSchema.safeParse({ shape: 'ring' });
    assert.equal(shape.success, false);
    assert.match(formatIssues(shape.error), /shape/);
    const fanout = schedulingSchema.safeParse({ shape: 'pipeline', pipeline: { fanout: 0 } });
    assert.equal(fanout.success, false);
    assert.match(formatIssues(fanout.error), /pipeline\.fanout/);
  });
});

describe('PieceSet', () => {
  it('adds, counts and iterates pieces in order, ignoring indexes outside the task', () => {
    const set = new PieceSet(70);
    for (const index of [69, 0, 33, 33, -1, 70, 1.5]) set.add(index);
    assert.equal(set.size, 3);
    assert.deepEqual([...set], [0, 33, 69]);
    assert.ok(set.has(33) && !set.has(34) && !set.has(70) && !set.has(-1));
  });

  it('tells whether it holds a piece another set lacks', () => {
    const parent = new PieceSet(100).add(5).add(64);
    const child = new PieceSet(100).add(5);
    assert.ok(parent.hasAnyMissingFrom(child));
    child.add(64).add(99);
    assert.ok(!parent.hasAnyMissingFrom(child));
    assert.ok(child.hasAnyMissingFrom(parent));
  });

  it('deletes pieces, and checks against two sets at once (held and arriving)', () => {
    const parent = new PieceSet(100).add(5).add(64);
    const held = new PieceSet(100).add(5);
    const arriving = new PieceSet(100).add(64);
    assert.ok(parent.hasAnyMissingFrom(held));
    assert.ok(!parent.hasAnyMissingFrom(held, arriving));
    arriving.delete(64).delete(64).delete(3);
    assert.equal(arriving.size, 0);
    assert.ok(parent.hasAnyMissingFrom(held, arriving));
  });
});

/** Reports piece `index` stored at `peer`, fetched from the origin. */
function store(e: { scheduling: { pieceFinished: (peer: Peer, report: PieceFinished) => void } }, peer: Peer, index: number): void {
  e.scheduling.pieceFinished(peer, { index, digest: digest(index), parentId: '', costMs: 1, fromOrigin: true, length: PIECE });
}

describe("scheduling: the swarm's on-demand reads (SwarmReading)", () => {
  /** Peers of two layers of one registry and one layer of another, each recording what it is told of the swarm's reads. */
  function layers() {
    const e = engine();
    const told = new Map<string, boolean[]>();
    const joinTask = (hostId: string, taskId: string, registry = REGISTRY) => {
      if (!e.scheduling.resources.hosts.has(hostId)) e.scheduling.announceHost(host(hostId));
      const id = `${hostId}|${taskId}`;
      told.set(id, []);
      return e.scheduling.register(
        {
          peerId: id,
          hostId,
          taskId,
          contentLength: 10 * PIECE,
          pieceSize: PIECE,
          origin: { url: `${registry}/v2/x/blobs/${taskId}`, public: true },
          heldPieces: [],
        },
        (packet) => {
          if (packet.packet === 'swarmReading') told.get(id)?.push(packet.swarmReading.onDemand);
        },
      );
    };
    const base = `sha256:${'1'.repeat(64)}`;
    const model = `sha256:${'2'.repeat(64)}`;
    const elsewhere = `sha256:${'3'.repeat(64)}`;
    const peers = {
      aBase: joinTask('a', base),
      aModel: joinTask('a', model),
      bModel: joinTask('b', model),
      cOther: joinTask('c', elsewhere, 'http://other-registry'),
    };
    const heard = (peer: Peer) => told.get(peer.id) ?? [];
    return { e, peers, heard, joinTask, base };
  }

  it("tells every peer of the registry's tasks when a piece a workload waits for starts arriving, and when that has stopped", () => {
    const { e, peers, heard, joinTask, base } = layers();
    e.scheduling.pieceStarted(peers.aModel, 0, { background: true });
    assert.deepEqual(heard(peers.bModel), [], 'a background piece says nothing');
    e.scheduling.pieceStarted(peers.aBase, 0);
    for (const peer of [peers.aBase, peers.aModel, peers.bModel]) assert.deepEqual(heard(peer), [true], peer.id);
    assert.deepEqual(heard(peers.cOther), [], "another registry's swarm is not told");
    e.scheduling.pieceStarted(peers.bModel, 1);
    assert.deepEqual(heard(peers.bModel), [true], 'once per change, not per piece');
    const late = joinTask('d', base);
    assert.deepEqual(heard(late), [true], 'a peer joining meanwhile is told as it registers');
    e.advance(1_000);
    store(e, peers.aBase, 0);
    store(e, peers.bModel, 1);
    e.advance(ON_DEMAND_QUIET_MS - 2_000);
    e.scheduling.tick();
    assert.deepEqual(heard(peers.aBase), [true], 'still reading a second short of the quiet period after the last such piece');
    e.advance(1_500);
    e.scheduling.tick();
    for (const peer of [peers.aBase, peers.aModel, peers.bModel, late]) assert.deepEqual(heard(peer), [true, false], peer.id);
    assert.deepEqual(heard(peers.cOther), []);
  });

  it('is not quiet while a piece a workload waits for is still arriving, however long ago it began', () => {
    const { e, peers, heard } = layers();
    e.scheduling.pieceStarted(peers.aModel, 0);
    e.scheduling.pieceStarted(peers.bModel, 1, { background: true }); // a background piece on its way keeps nothing going
    e.advance(ON_DEMAND_QUIET_MS + 2_000);
    e.scheduling.tick();
    assert.deepEqual(heard(peers.bModel), [true], 'a slow link: the piece started longer ago than the quiet period and still comes');
    store(e, peers.aModel, 0);
    e.advance(ON_DEMAND_QUIET_MS - 1_000);
    e.scheduling.tick();
    assert.deepEqual(heard(peers.bModel), [true], 'reading until the quiet period after the last check that found one arriving');
    e.advance(1_500);
    e.scheduling.tick();
    assert.deepEqual(heard(peers.bModel), [true, false]);
  });

  it('forgets a piece start that never ends (GROWING_TTL_MS): the swarm goes quiet after all', () => {
    const { e, peers, heard } = layers();
    e.scheduling.pieceStarted(peers.aModel, 0);
    e.advance(GROWING_TTL_MS + 1);
    e.scheduling.tick();
    assert.deepEqual(heard(peers.bModel), [true, false]);
  });

  it('counts a span read for a workload as the swarm reading on demand, though no piece arrives', () => {
    const { e, peers, heard } = layers();
    e.scheduling.spanRead(peers.aModel);
    assert.deepEqual(heard(peers.bModel), [true]);
    assert.equal(peers.aModel.growing.size + peers.aModel.pieces.size, 0, 'the reader holds no piece for it');
    e.advance(2_000);
    e.scheduling.spanRead(peers.aBase);
    e.advance(ON_DEMAND_QUIET_MS - 1_000);
    e.scheduling.tick();
    assert.deepEqual(heard(peers.bModel), [true], 'a later span keeps the swarm reading');
    e.advance(1_500);
    e.scheduling.tick();
    assert.deepEqual(heard(peers.bModel), [true, false]);
  });
});
