// A registry that lies to a swarm (docs/security.md, "A registry that lies"): a range it answers
// wrongly to the peer reading it for the swarm becomes a piece digest the scheduler only vouches
// for (the registry's word, as the swarm read it once), never a confirmed one. The first
// whole-blob check that fails makes every peer drop what it holds unconfirmed and the scheduler
// forget the vouched digests, so the next pulls get the registry's true bytes on every node; a
// blob that verifies whole confirms its piece digests swarm-wide.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { request } from 'undici';
import type { TaskStat } from '../../src/rpc/scheduler-api.js';
import { startLyingRegistry, type LyingRegistry } from '../fixtures/lying-registry.js';
import { startPeer, startScheduler, type RunningPeerProcess, type RunningSchedulerProcess } from '../fixtures/peer.js';

const MiB = 1024 * 1024;
const sha256 = (bytes: Buffer) => `sha256:${createHash('sha256').update(bytes).digest('hex')}`;

describe('a registry that lies to a swarm', { timeout: 180_000 }, () => {
  let registry: LyingRegistry;
  let scheduler: RunningSchedulerProcess;
  let seed: RunningPeerProcess;
  let reader: RunningPeerProcess;
  let other: RunningPeerProcess;

  before(async () => {
    registry = await startLyingRegistry('127.0.0.71');
    scheduler = await startScheduler({ ip: '127.0.0.72' });
    const swarm = { schedulers: [scheduler.address], insecure: [registry.host] };
    seed = await startPeer({ ip: '127.0.0.73', seed: true, ...swarm });
    reader = await startPeer({ ip: '127.0.0.74', ...swarm });
    other = await startPeer({ ip: '127.0.0.75', ...swarm });
  });
  after(async () => {
    for (const running of [reader, other, seed, scheduler, registry]) await running?.stop().catch(() => undefined);
  });

  const get = async (peer: RunningPeerProcess, digest: string, headers: Record<string, string> = {}) => {
    try {
      const response = await request(`${peer.url}/v2/liar/blob/blobs/${digest}?ns=${registry.host}`, { headers });
      return { status: response.statusCode, body: Buffer.from(await response.body.arrayBuffer()) };
    } catch {
      return { status: 0, body: Buffer.alloc(0) }; // cut short
    }
  };

  it("serves the lie a seed was told to no later request once the registry tells the truth, and every node's next whole pull verifies", async () => {
    const { digest, bytes } = registry.add({ size: 10 * MiB, lies: { wrongBytes: 'ranges' } });
    const range = { range: 'bytes=100-199' };
    const truth = bytes.subarray(100, 200);

    // The seed reads piece 0 for the reader with a Range request, and is lied to.
    const lied = await get(reader, digest, range);
    assert.equal(lied.status, 206);
    assert.ok(!lied.body.equals(truth), "the registry's answer reaches the request it answered");
    registry.lie(digest, {});

    // The first whole read on the reader exposes the lie (it holds the piece, unverified): it never completes.
    const exposed = await get(reader, digest);
    assert.ok(exposed.status === 0 || !exposed.body.equals(bytes), 'no wrong blob is ever completed');
    // Every peer dropped what it held unverified: the next pulls take the true bytes, on every node.
    for (const peer of [other, reader, seed]) {
      const whole = await get(peer, digest);
      assert.equal(whole.status, 200);
      assert.equal(sha256(whole.body), digest, `a whole pull through ${peer.host} verifies`);
    }
    for (const peer of [other, reader]) assert.ok((await get(peer, digest, range)).body.equals(truth));
    const stat = (await (await scheduler.task(digest)).body.json()) as TaskStat;
    assert.equal(stat.confirmedDigests, stat.pieceCount, 'the verified blobs confirmed every piece digest');
    assert.equal(stat.trustedDigests, stat.pieceCount);
  });
});
