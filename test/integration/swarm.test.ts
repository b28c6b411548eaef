// The swarm with real processes on distinct loopback addresses and a real docker-registry:
// one copy from the registry, no cycles, no self-downloads, topology, chaos.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import { request } from 'undici';
import { startBitFlippingPeer } from '../fixtures/bad-peer.js';
import { pushRandomBlob, type PushedBlob } from '../fixtures/images.js';
import {
  clusterToken,
  pullThrough,
  startPeer,
  startScheduler,
  type RunningPeerProcess,
  type RunningSchedulerProcess,
} from '../fixtures/peer.js';
import { freePort, waitFor } from '../fixtures/processes.js';
import { blobBytesSent, blobRequests, startRegistry, type Registry } from '../fixtures/registry.js';
import { startLyingRegistry } from '../fixtures/lying-registry.js';
import { READ_CHECKED_HEADER, READ_PRIORITY_HEADER, type ReadPriority } from '../../src/rpc/mirror-api.js';
import type { TaskStat } from '../../src/rpc/scheduler-api.js';
import { ON_DEMAND_QUIET_MS } from '../../src/scheduler/on-demand-reading.js';
import {
  CLIENT_ORIGIN_HEADER,
  PREHEAT_PATH,
  preheatStatusPath,
  spanRequestPath,
  type BlobFetchRequest,
  type FetchStatus,
} from '../../src/rpc/upload-api.js';
import { itemAt } from '../../src/common/indexing.js';
import { pieceSizeFor } from '../../src/storage/piece-plan.js';

const MB = 1000 * 1000;

/** A loopback address per test and peer, so every process is its own "host". */
let nextIp = 20;
const ip = () => `127.0.0.${nextIp++}`;

async function taskStat(scheduler: RunningSchedulerProcess, digest: string): Promise<TaskStat> {
  const response = await scheduler.task(digest);
  assert.equal(response.statusCode, 200);
  return (await response.body.json()) as TaskStat;
}

/** Waits until the scheduler knows a peer that holds the whole blob (peers register on streams of their own). */
async function waitForHolder(scheduler: RunningSchedulerProcess, digest: string, what: string): Promise<void> {
  await waitFor(
    async () => {
      const response = await scheduler.task(digest);
      if (response.statusCode !== 200) return (await response.body.dump(), false);
      return ((await response.body.json()) as TaskStat).peers.some((peer) => peer.finished);
    },
    30_000,
    what,
  );
}

async function registryCopies(registry: Registry, blob: PushedBlob): Promise<number> {
  await waitFor(() => blobRequests(registry.requests(), blob.digest).length > 0, 5000, 'registry access log');
  return blobBytesSent(registry.requests(), blob.digest) / blob.size;
}

describe('swarm: scheduler, seed and peers', { timeout: 600_000 }, () => {
  let registry: Registry;
  const running: Array<{ stop(): Promise<void> }> = [];
  before(async () => {
    registry = await startRegistry();
  });
  after(async () => {
    for (const process of running.reverse()) await process.stop().catch(() => undefined);
    await registry?.stop();
  });

  async function cluster(
    count: number,
    options: {
      seedArgs?: string[];
      peerArgs?: string[];
      schedulerArgs?: string[];
      labels?: (i: number) => Record<string, string>;
      seeds?: Array<Record<string, string>>;
      /** The registries the peers reach over plain HTTP (default: the docker-registry). */
      insecure?: string[];
    } = {},
  ) {
    const insecure = options.insecure ?? [registry.host];
    const scheduler = await startScheduler({ ip: ip(), extraArgs: options.schedulerArgs });
    running.push(scheduler);
    const seeds: RunningPeerProcess[] = [];
    for (const labels of options.seeds ?? [{}]) {
      // seeds: [] builds a swarm without seeds.
      const seed = await startPeer({
        ip: ip(),
        schedulers: [scheduler.address],
        seed: true,
        labels,
        insecure,
        extraArgs: options.seedArgs,
      });
      running.push(seed);
      seeds.push(seed);
    }
    const peers = await Promise.all(
      Array.from({ length: count }, (_, i) =>
        startPeer({
          ip: ip(),
          schedulers: [scheduler.address],
          labels: options.labels?.(i),
          insecure,
          extraArgs: options.peerArgs,
        }),
      ),
    );
    running.push(...peers);
    return { scheduler, seeds, peers };
  }

  it('1 seed + 8 peers pull a 256 MB blob at once: one copy from the registry, no cycle, no self-download', async () => {
    const { scheduler, peers } = await cluster(8);
    const blob = await pushRandomBlob(registry, 'swarm/big', 256 * MB);
    const results = await Promise.all(peers.map((peer) => pullThrough(peer, registry, 'swarm/big', blob.digest)));
    for (const result of results) assert.deepEqual(result, { status: 200, digest: blob.digest, bytes: blob.size });

    const copies = await registryCopies(registry, blob);
    assert.ok(copies <= 1.05, `registry sent ${copies.toFixed(3)} copies`);
    const stat = await taskStat(scheduler, blob.digest);
    assert.equal(stat.cyclesDetected, 0, 'the parent graph never had a cycle');
    for (const peer of stat.peers) {
      assert.ok(!(peer.hostId in peer.bytesByParentHost), `${peer.peerId} downloaded from itself`);
    }
    assert.equal(stat.bytesFromOrigin, blob.size, 'only the seed read the origin');
    assert.ok(stat.bytesFromSeeds + stat.bytesFromPeers >= 8 * blob.size);
    const fromOrigin = await Promise.all(peers.map((peer) => peer.metric('starling_peer_downloaded_bytes_total', { source: 'origin' })));
    assert.deepEqual(fromOrigin, Array(8).fill(0), 'no ordinary peer touched the registry');
  });

  const shapes = [
    { shape: 'adaptive', schedulerArgs: [] },
    { shape: 'mesh', schedulerArgs: ['--shape', 'mesh'] },
    { shape: 'pipeline', schedulerArgs: ['--shape', 'pipeline'] },
  ];

  for (const { shape, schedulerArgs } of shapes) {
    it(`a strict zone rule keeps pieces in the zone once a same-zone parent holds them (${shape})`, async () => {
      const zones = (i: number) => ({ zone: i < 3 ? 'a' : 'b', rack: `r${i % 2}` });
      const { scheduler, peers } = await cluster(6, { labels: zones, seeds: [{ zone: 'a' }], schedulerArgs });
      const repo = `swarm/zones-${shape}`;
      const blob = await pushRandomBlob(registry, repo, 48 * MB);
      // Zone a pulls, then one peer of zone b (it may cross: zone b has nobody yet).
      await Promise.all(peers.slice(0, 4).map((peer) => pullThrough(peer, registry, repo, blob.digest)));
      // Now zone b holds the blob: the rest of zone b must not take a byte from zone a.
      const late = await Promise.all(peers.slice(4).map((peer) => pullThrough(peer, registry, repo, blob.digest)));
      for (const result of late) assert.equal(result.digest, blob.digest);
      const stat = await taskStat(scheduler, blob.digest);
      const zoneOf = new Map(stat.peers.map((p) => [p.hostId, p.labels.zone]));
      for (const peer of stat.peers.filter((p) => p.labels.zone === 'a' && !p.seed)) {
        for (const parentHost of Object.keys(peer.bytesByParentHost))
          assert.equal(zoneOf.get(parentHost), 'a', `${peer.peerId} took bytes from zone b`);
      }
      const lateHosts = peers.slice(4).map((late) => `-${late.host.split(':')[0]}-`);
      const latePeers = stat.peers.filter((p) => lateHosts.some((marker) => p.hostId.includes(marker)));
      assert.equal(latePeers.length, 2);
      for (const peer of latePeers) {
        for (const parentHost of Object.keys(peer.bytesByParentHost)) {
          assert.equal(zoneOf.get(parentHost), 'b', `${peer.peerId} crossed zones although zone b held the blob`);
        }
      }
    });
  }

  it('in a pipeline, chains the peers (one parent, at most one child each) and still takes one copy from the registry', async () => {
    const limit = ['--upload-rate-limit', '40MB'];
    const { scheduler, peers } = await cluster(8, { seedArgs: limit, peerArgs: limit, schedulerArgs: ['--shape', 'pipeline'] });
    const blob = await pushRandomBlob(registry, 'swarm/pipeline', 96 * MB);
    let done = false;
    const looks: TaskStat[] = [];
    const watch = (async () => {
      while (!done) {
        const response = await scheduler.task(blob.digest);
        if (response.statusCode === 200) looks.push((await response.body.json()) as TaskStat);
        else await response.body.dump();
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    })();
    const results = await Promise.all(peers.map((peer) => pullThrough(peer, registry, 'swarm/pipeline', blob.digest)));
    done = true;
    await watch;
    for (const result of results) assert.deepEqual(result, { status: 200, digest: blob.digest, bytes: blob.size });
    assert.ok(looks.length >= 5, `only ${looks.length} looks at the parent graph during the pull`);
    for (const stat of looks) {
      const children = new Map<string, number>();
      for (const peer of stat.peers) {
        assert.ok(peer.parents.length <= 1, `${peer.peerId} had ${peer.parents.length} parents`);
        for (const parent of peer.parents) children.set(parent, (children.get(parent) ?? 0) + 1);
      }
      for (const [parent, count] of children) assert.equal(count, 1, `${parent} fed ${count} children at once`);
    }
    const copies = await registryCopies(registry, blob);
    assert.ok(copies <= 1.05, `registry sent ${copies.toFixed(3)} copies`);
    const stat = await taskStat(scheduler, blob.digest);
    assert.equal(stat.cyclesDetected, 0);
    assert.ok(stat.bytesFromPeers >= 6 * blob.size, 'most bytes went from node to node, along the chains');
  });

  it('a peer whose upload is throttled feeds no chain: the fast peers finish before it could have fed them', async () => {
    const { scheduler, peers } = await cluster(5, { seedArgs: ['--upload-rate-limit', '20MB'], peerArgs: ['--upload-rate-limit', '40MB'] });
    const throttledRate = 2 * MB;
    const throttled = await startPeer({
      ip: ip(),
      schedulers: [scheduler.address],
      insecure: [registry.host],
      extraArgs: ['--upload-rate-limit', '2MB'],
    });
    running.push(throttled);
    const repo = 'swarm/throttled';
    const blob = await pushRandomBlob(registry, repo, 96 * MB);
    // The throttled peer starts first: it holds pieces (and the seed's chain slot) when the others come.
    const first = pullThrough(throttled, registry, repo, blob.digest);
    await waitFor(async () => (await throttled.metric('starling_peer_storage_bytes')) > 0, 60_000, 'the throttled peer under way');
    const started = Date.now();
    const took: number[] = [];
    const results = await Promise.all(
      peers.map(async (peer) => {
        const result = await pullThrough(peer, registry, repo, blob.digest);
        took.push((Date.now() - started) / 1000);
        return result;
      }),
    );
    for (const result of [...results, await first]) assert.deepEqual(result, { status: 200, digest: blob.digest, bytes: blob.size });

    // Below the throttled peer in a chain, a peer would have taken the blob's size at its rate (48 s).
    // The bound is that time itself, not a fraction of it (half of it failed on a 2-core machine at
    // load 8-19); the bytes below say where the fast peers' bytes came from.
    const alone = blob.size / throttledRate;
    assert.ok(
      Math.max(...took) < alone,
      `the fast peers took ${took.map((t) => t.toFixed(1)).join(', ')} s; fed by the throttled peer, ${alone.toFixed(0)} s`,
    );
    const stat = await taskStat(scheduler, blob.digest);
    const throttledStat = stat.peers.find((peer) => peer.hostId.includes(`-${throttled.host.split(':')[0]}-`));
    assert.ok(throttledStat, `the scheduler lists the throttled peer ${throttled.host}`);
    const throttledHost = throttledStat.hostId;
    for (const peer of stat.peers.filter((p) => !p.seed && p.hostId !== throttledHost)) {
      const fromThrottled = peer.bytesByParentHost[throttledHost] ?? 0;
      assert.ok(fromThrottled < blob.size / 4, `${peer.peerId} took ${fromThrottled} B of ${blob.size} from the throttled peer`);
    }
  });

  for (const { shape, schedulerArgs } of shapes) {
    it(`survives 2 of 8 peers killed mid-transfer (${shape})`, async () => {
      const limit = ['--upload-rate-limit', '40MB'];
      const { peers } = await cluster(8, { seedArgs: limit, peerArgs: limit, schedulerArgs });
      const blob = await pushRandomBlob(registry, `swarm/chaos-${shape}`, 96 * MB);
      const pulls = peers.map((peer) =>
        pullThrough(peer, registry, `swarm/chaos-${shape}`, blob.digest).catch((error: Error) => ({ error })),
      );
      const victims = peers.slice(0, 2);
      await waitFor(async () => (await itemAt(victims, 0).metric('starling_peer_storage_bytes')) > 20 * MB, 60_000, 'victims mid-transfer');
      await Promise.all(victims.map((victim) => victim.service.kill9()));
      const results = await Promise.all(pulls);
      for (const result of results.slice(2)) assert.deepEqual(result, { status: 200, digest: blob.digest, bytes: blob.size });
    });

    it(`blocklists a peer that flips bits, and every downloader still ends with correct data (${shape})`, async () => {
      const { scheduler, peers } = await cluster(4, { seedArgs: ['--upload-rate-limit', '30MB'], schedulerArgs });
      const repo = `swarm/evil-${shape}`;
      const blob = await pushRandomBlob(registry, repo, 40 * MB);
      const bad = await startBitFlippingPeer({
        scheduler: scheduler.address,
        ip: ip(),
        blobUrl: `${registry.url}/v2/${repo}/blobs/${blob.digest}`,
        digest: blob.digest,
        size: blob.size,
        clusterToken: (await clusterToken()).token,
      });
      running.push(bad);
      const results = await Promise.all(peers.map((peer) => pullThrough(peer, registry, repo, blob.digest)));
      for (const result of results) assert.deepEqual(result, { status: 200, digest: blob.digest, bytes: blob.size });
      assert.ok(bad.served() > 0, 'the bad peer was asked for pieces');
      const dropped = await Promise.all(peers.map((peer) => peer.metric('starling_peer_parents_dropped_total', { reason: 'bad_piece' })));
      assert.ok(dropped.reduce((a, b) => a + b, 0) >= 1, 'the bad peer was dropped as a parent');
      const stat = await taskStat(scheduler, blob.digest);
      for (const peer of stat.peers) assert.ok(!(bad.hostId in peer.bytesByParentHost), 'no byte from the bad peer was stored');
    });
  }

  it('a restarted peer offers the blobs it kept, so the next pull needs no origin', async () => {
    const { scheduler, peers } = await cluster(2, { seeds: [] });
    const blob = await pushRandomBlob(registry, 'swarm/restart', 20 * MB);
    const [first, second] = peers as [RunningPeerProcess, RunningPeerProcess];
    assert.equal((await pullThrough(first, registry, 'swarm/restart', blob.digest)).digest, blob.digest);
    // The client has its bytes before the peer has verified and stored the whole blob: stopped
    // before that, it keeps a blob it does not know whole (the test failed so about once in 25
    // runs). The peer tells the scheduler once it has; and after it stops, the scheduler forgets it.
    await waitForHolder(scheduler, blob.digest, 'the first peer holding the blob whole');
    await first.stop();
    await waitFor(
      async () => {
        const response = await scheduler.task(blob.digest);
        if (response.statusCode !== 200) return (await response.body.dump(), true);
        return !((await response.body.json()) as TaskStat).peers.some((peer) => peer.finished);
      },
      30_000,
      'the scheduler forgetting the stopped peer',
    );
    const restarted = await first.restart();
    running.push(restarted);
    // The restarted peer registers what it kept on a stream it opens after start-up; under load the
    // next pull's register could come first and be sent to the origin: wait for the scheduler to know it.
    await waitForHolder(scheduler, blob.digest, 'the restarted peer offering its blob');
    const result = await pullThrough(second, registry, 'swarm/restart', blob.digest);
    assert.equal(result.digest, blob.digest);
    // Once in bytes: the first pull's seedless origin read takes the last piece on a request of its own.
    assert.equal(blobBytesSent(registry.requests(), blob.digest), blob.size, 'the registry sent the blob once');
    assert.equal(await second.metric('starling_peer_downloaded_bytes_total', { source: 'peer' }), blob.size);
  });

  it('a peer holding a blob registers it again when its only scheduler restarts', async () => {
    const { scheduler, peers } = await cluster(2, { seeds: [] });
    const blob = await pushRandomBlob(registry, 'swarm/scheduler-restart', 20 * MB);
    const [first, second] = peers as [RunningPeerProcess, RunningPeerProcess];
    assert.equal((await pullThrough(first, registry, 'swarm/scheduler-restart', blob.digest)).digest, blob.digest);
    await waitForHolder(scheduler, blob.digest, 'the first peer holding the blob');
    // A restarted scheduler knows nothing: the holder's stream ended, and it had no other scheduler.
    await scheduler.stop();
    const restarted = await scheduler.restart();
    running.push(restarted);
    await waitForHolder(restarted, blob.digest, 'the holder registering again with the restarted scheduler');
    // The restarted scheduler trusts no piece digest until a peer it sends to the origin reports them:
    // the next pull reads the registry once more, and the two holders serve every later one.
    assert.equal((await pullThrough(second, registry, 'swarm/scheduler-restart', blob.digest)).digest, blob.digest);
    // The second peer's last report and the registry's log line may trail the pull's last byte.
    await waitFor(
      async () => (await taskStat(restarted, blob.digest)).peers.filter((peer) => peer.finished).length === 2,
      30_000,
      'both peers holding the blob, as the restarted scheduler sees it',
    );
    await waitFor(() => blobBytesSent(registry.requests(), blob.digest) >= 2 * blob.size, 10_000, "the registry's log of the second copy");
    assert.equal(blobBytesSent(registry.requests(), blob.digest), 2 * blob.size, 'the registry sent one copy per scheduler memory');
  });

  it("a lazy reader whose reads are served gives its parent's upload slot back, so a reader of another blob gets the seed at once", async () => {
    // One upload slot on the seed, counted across tasks: the first reader takes it.
    const { peers } = await cluster(2, { seedArgs: ['--upload-slots', '1'] });
    const [first, second] = peers as [RunningPeerProcess, RunningPeerProcess];
    const blobs = [await pushRandomBlob(registry, 'swarm/lazy-a', 12 * MB), await pushRandomBlob(registry, 'swarm/lazy-b', 12 * MB)];
    const footer = async (peer: RunningPeerProcess, blob: PushedBlob, repo: string) => {
      const response = await request(`${peer.url}/v2/${repo}/blobs/${blob.digest}?ns=${registry.host}`, {
        headers: { range: 'bytes=-51' },
      });
      assert.equal(response.statusCode, 206);
      assert.ok(Buffer.from(await response.body.arrayBuffer()).equals(readFileSync(blob.path).subarray(blob.size - 51)));
    };
    await footer(first, itemAt(blobs, 0), 'swarm/lazy-a');
    // The first reader wants nothing more but never finishes its blob: without giving its parent
    // back it would hold the seed's slot, and the second reader would wait a minute for the origin.
    const started = Date.now();
    await footer(second, itemAt(blobs, 1), 'swarm/lazy-b');
    const seconds = (Date.now() - started) / 1000;
    assert.ok(seconds < 10, `the second reader waited ${seconds.toFixed(1)} s for the seed`);
    assert.equal(
      await second.metric('starling_peer_downloaded_bytes_total', { source: 'origin' }),
      0,
      'it did not go to the registry itself',
    );
  });

  /** Reads bytes [first, end) of the blob through a peer and checks them; resolves to when the last came. */
  function rangeReader(name: string, blob: PushedBlob, bytes: Buffer) {
    return async (peer: RunningPeerProcess, first: number, end: number, headers: Record<string, string> = {}) => {
      const response = await request(`${peer.url}/v2/${name}/blobs/${blob.digest}?ns=${registry.host}`, {
        headers: { range: `bytes=${first}-${end - 1}`, ...headers },
      });
      assert.equal(response.statusCode, 206);
      assert.ok(Buffer.from(await response.body.arrayBuffer()).equals(bytes.subarray(first, end)), `bytes ${first}-${end - 1}`);
      return Date.now();
    };
  }

  /**
   * Two peers under a seed with one upload slot paced at `rateLimit`; the first streams the blob's
   * first piece through it, and holds the slot until that piece is through.
   */
  async function seedBusyWithAPiece(name: string, rateLimit: string) {
    const { seeds, peers } = await cluster(2, { seedArgs: ['--upload-slots', '1', '--upload-rate-limit', rateLimit] });
    const [streamer, mounter] = peers as [RunningPeerProcess, RunningPeerProcess];
    const blob = await pushRandomBlob(registry, name, 12 * MB);
    const bytes = readFileSync(blob.path);
    const piece = 4 * 1024 * 1024;
    const read = rangeReader(name, blob, bytes);
    const streaming = read(streamer, 0, piece);
    const seed = itemAt(seeds, 0);
    await waitFor(
      async () => (await seed.metric('starling_peer_upload_requests_total', { kind: 'piece', outcome: 'fetched' })) >= 1,
      10_000,
      'the piece under way',
    );
    return { seed, mounter, blob, piece, read, streaming };
  }

  it("a lazy mount's footer is served beside a seed's busy upload slots, not refused into a whole piece from the registry", async () => {
    // A piece at 1 MB/s holds the seed's one slot for four seconds.
    const { seed, mounter, blob, piece, read, streaming } = await seedBusyWithAPiece('swarm/busy-seed-footer', '1MB');
    const started = Date.now();
    const footerRead = await read(mounter, blob.size - 51, blob.size, { [READ_CHECKED_HEADER]: 'toc' });
    const streamed = await streaming;
    assert.ok(footerRead < streamed, 'the footer came while the piece still held the slot');
    assert.ok(footerRead - started < 2_000, `the footer took ${footerRead - started} ms`);
    assert.equal(await seed.metric('starling_peer_upload_requests_total', { kind: 'span', outcome: 'busy' }), 0, 'no span was refused');
    // The registry sent the piece and the footer's bytes, not the blob's last piece.
    await waitFor(() => blobRequests(registry.requests(), blob.digest).length >= 2, 10_000, "the registry's log");
    assert.deepEqual(
      blobRequests(registry.requests(), blob.digest)
        .map((r) => r.bytesWritten)
        .sort((a, b) => a - b),
      [51, piece],
    );
  });

  it("a lazy mount's prefetch span waits for a busy seed's slot, rather than fetching its whole piece from the registry", async () => {
    // A piece at 512 KB/s holds the seed's one slot for eight seconds, longer than a span waits
    // for a parent that gives nothing.
    const { mounter, blob, piece, read, streaming } = await seedBusyWithAPiece('swarm/busy-seed-prefetch', '512KB');
    // 1.5 MB of the next piece: a prefetch range's end, too large for the small spans' lane.
    const prefetchEnd = await read(mounter, piece, piece + 1_500_000, { [READ_CHECKED_HEADER]: 'toc' });
    assert.ok(prefetchEnd >= (await streaming) - 1_000, 'the span waited for the slot');
    await waitFor(() => blobRequests(registry.requests(), blob.digest).length >= 2, 10_000, "the registry's log");
    assert.deepEqual(
      blobRequests(registry.requests(), blob.digest)
        .map((r) => r.bytesWritten)
        .sort((a, b) => a - b),
      [1_500_000, piece],
      'the registry sent the span, not the piece around it',
    );
  });

  it('a seed triggered for a lazy reader reads from the registry only the pieces the reader asks for, in its order', async () => {
    const { seeds, peers } = await cluster(1);
    const blob = await pushRandomBlob(registry, 'swarm/on-demand', 30 * MB);
    const bytes = readFileSync(blob.path);
    const read = async (range: string, first: number, end: number) => {
      const response = await request(`${itemAt(peers, 0).url}/v2/swarm/on-demand/blobs/${blob.digest}?ns=${registry.host}`, {
        headers: { range: `bytes=${range}` },
      });
      assert.equal(response.statusCode, 206);
      assert.ok(Buffer.from(await response.body.arrayBuffer()).equals(bytes.subarray(first, end)), `bytes ${range}`);
    };
    // A lazy mount's reads: the footer (in the blob's last piece), then a file in piece 2.
    const piece = 4 * 1024 * 1024;
    await read('-51', blob.size - 51, blob.size);
    await read(`${2 * piece + 10}-${2 * piece + 99}`, 2 * piece + 10, 2 * piece + 100);
    // The seed read those two pieces, one request each, in the reader's order, and nothing else
    // (a seed reading the whole blob would have sent its other 5 pieces through the registry's link).
    const lastPiece = blob.size - 7 * piece;
    await waitFor(() => blobRequests(registry.requests(), blob.digest).length >= 2, 30_000, 'both origin reads');
    assert.deepEqual(
      blobRequests(registry.requests(), blob.digest).map((r) => r.bytesWritten),
      [lastPiece, piece],
      'the registry sent the two pieces asked for',
    );
    assert.equal(await itemAt(seeds, 0).metric('starling_peer_downloaded_bytes_total', { source: 'origin' }), lastPiece + piece);
    assert.equal(
      await itemAt(peers, 0).metric('starling_peer_downloaded_bytes_total', { source: 'origin' }),
      0,
      'the reader got them from the seed',
    );
    assert.equal(await itemAt(seeds, 0).metric('starling_peer_upload_requests_total', { kind: 'piece', outcome: 'fetched' }), 2);
  });

  it('lazy readers ask for the pieces their workloads wait for in index order, and the seed reads them from the registry in that order', async () => {
    // A registry slow enough that pieces are on their way for a while. Every node asks for the
    // pieces in the same order, so a chain child asks its parent for the piece the parent is
    // receiving (relayed as it comes), not for one the parent would fetch only later.
    const origin = await startLyingRegistry();
    running.push(origin);
    const { peers } = await cluster(2, { insecure: [origin.host] });
    const piece = 4 * 1024 * 1024;
    const { digest, bytes } = origin.add({ size: 6 * piece, lies: { bytesPerSecond: 8 * MB } });
    const read = async (peer: RunningPeerProcess) => {
      const response = await request(`${peer.url}/v2/swarm/in-order/blobs/${digest}?ns=${origin.host}`, {
        headers: { range: `bytes=0-${4 * piece - 1}` },
      });
      assert.equal(response.statusCode, 206);
      assert.ok(Buffer.from(await response.body.arrayBuffer()).equals(bytes.subarray(0, 4 * piece)), 'the bytes read');
    };
    await Promise.all(peers.map(read));
    // Each node's first ask of each piece (a busy parent is asked again), from its debug log.
    const asked = (peer: RunningPeerProcess) => {
      const indexes = peer.service
        .readLog()
        .split('\n')
        .flatMap((line) => {
          const entry = /^\{/.test(line) ? (JSON.parse(line) as { msg?: string; task?: string; index?: number }) : {};
          return entry.msg === 'piece asked' && entry.task === digest ? [entry.index] : [];
        });
      return [...new Set(indexes)];
    };
    for (const peer of peers) assert.deepEqual(asked(peer), [0, 1, 2, 3], `the pieces ${peer.host} asked its parents for, in order`);
    const starts = origin
      .requests()
      .filter((r) => r.method === 'GET' && r.path.endsWith(digest) && r.range !== undefined)
      .map((r) => Number(/^bytes=(\d+)-/.exec(r.range ?? '')?.[1]));
    assert.deepEqual(
      starts,
      [0, 1, 2, 3].map((index) => index * piece),
      'the seed read each piece once, in order',
    );
  });

  for (const { shape, schedulerArgs } of shapes.filter(({ shape }) => shape !== 'mesh')) {
    it(`lazy readers that check what they read get the parts of pieces they need, and the registry sends those bytes once (${shape})`, async () => {
      const { seeds, peers } = await cluster(3, { schedulerArgs });
      const name = `swarm/spans-${shape}`;
      const blob = await pushRandomBlob(registry, name, 30 * MB);
      const bytes = readFileSync(blob.path);
      const piece = 4 * 1024 * 1024;
      const read = async (peer: RunningPeerProcess, first: number, end: number, checked = true) => {
        const response = await request(`${peer.url}/v2/${name}/blobs/${blob.digest}?ns=${registry.host}`, {
          headers: { range: `bytes=${first}-${end - 1}`, ...(checked ? { [READ_CHECKED_HEADER]: 'toc' } : {}) },
        });
        assert.equal(response.statusCode, 206);
        const body = Buffer.from(await response.body.arrayBuffer());
        assert.ok(body.equals(bytes.subarray(first, end)), `bytes ${first}-${end - 1}`);
      };
      // A lazy mount's reads on every node: the footer, a file inside piece 2, and a prefetch
      // range that ends inside piece 1 (piece 0 whole, 100 bytes of piece 1).
      const reads: Array<[number, number]> = [
        [blob.size - 51, blob.size],
        [2 * piece + 10, 2 * piece + 100],
        [0, piece + 100],
      ];
      for (const peer of peers) for (const [first, end] of reads) await read(peer, first, end);
      const needed = 51 + 90 + piece + 100;
      await waitFor(() => blobBytesSent(registry.requests(), blob.digest) >= needed, 10_000, 'the registry log');
      assert.equal(
        blobBytesSent(registry.requests(), blob.digest),
        needed,
        `the registry sent the bytes read, once, and no whole edge piece: ${JSON.stringify(blobRequests(registry.requests(), blob.digest).map((r) => r.bytesWritten))}`,
      );
      assert.equal(
        (await Promise.all(peers.map((peer) => peer.metric('starling_peer_span_bytes_total')))).reduce((a, b) => a + b, 0),
        3 * (51 + 90 + 100),
        'every reader got its edge bytes as spans',
      );
      assert.ok((await itemAt(seeds, 0).metric('starling_peer_upload_requests_total', { kind: 'span' })) >= 3);
      // A client that does not say it checks what it reads gets whole, checked pieces.
      await read(itemAt(peers, 0), 3 * piece + 5, 3 * piece + 50, false);
      await waitFor(() => blobBytesSent(registry.requests(), blob.digest) >= needed + piece, 10_000, 'the registry log');
      assert.equal(blobBytesSent(registry.requests(), blob.digest), needed + piece);
      // The whole blob afterwards, through the swarm: verified, and the registry sent it once in
      // all (the seed read the pieces around the spans it had read).
      const whole = await request(`${itemAt(peers, 1).url}/v2/${name}/blobs/${blob.digest}?ns=${registry.host}`);
      assert.equal(whole.statusCode, 200);
      assert.ok(Buffer.from(await whole.body.arrayBuffer()).equals(bytes));
      await waitFor(() => blobBytesSent(registry.requests(), blob.digest) >= blob.size, 10_000, 'the registry log');
      assert.equal(blobBytesSent(registry.requests(), blob.digest), blob.size, 'one copy in all');

      // The span door refuses what is no span, and anyone without the cluster token.
      const { token } = await clusterToken();
      const seed = itemAt(seeds, 0);
      const spanUrl = (start: number, end: number, hops = 0) =>
        `http://${seed.options.ip}:${seed.options.uploadPort}${spanRequestPath(blob.digest, 2, { start, end }, hops)}`;
      const asChild = {
        authorization: `Bearer ${token}`,
        [CLIENT_ORIGIN_HEADER]: `http://${registry.host}/v2/${name}/blobs/${blob.digest}`,
      };
      const beyond = await request(spanUrl(0, piece), { headers: asChild });
      assert.equal(beyond.statusCode, 416);
      assert.match(await beyond.body.text(), /not a span of piece 2/);
      const looping = await request(spanUrl(0, 9, 1000), { headers: asChild });
      assert.equal(looping.statusCode, 400);
      assert.match(await looping.body.text(), /hops 1000/);
      const stranger = await request(spanUrl(0, 9));
      assert.equal(stranger.statusCode, 401);
      await stranger.body.dump();
      const good = await request(spanUrl(10, 99), { headers: asChild });
      assert.equal(good.statusCode, 200);
      assert.ok(Buffer.from(await good.body.arrayBuffer()).equals(bytes.subarray(2 * piece + 10, 2 * piece + 100)));
    });
  }

  for (const { shape, schedulerArgs } of shapes.filter(({ shape }) => shape !== 'pipeline')) {
    it(`a background read waits while another node reads what its workload waits for, then the seed serves it from the registry once (${shape})`, async () => {
      // In a mesh the filler has the seed among its parents; in chains its one parent may be the
      // reader, which then fetches the piece for it through its own parent, the seed. The filler
      // holds its background pieces while the scheduler says the swarm reads on demand
      // (SwarmReading); one asked before that word came, the seed puts off. Either way the
      // registry's log shows the order.
      const { peers } = await cluster(2, { schedulerArgs });
      const [reader, filler] = peers as [RunningPeerProcess, RunningPeerProcess];
      const blob = await pushRandomBlob(registry, `swarm/background-${shape}`, 30 * MB);
      const bytes = readFileSync(blob.path);
      const piece = 4 * 1024 * 1024;
      const read = async (peer: RunningPeerProcess, first: number, end: number, priority?: ReadPriority) => {
        const response = await request(`${peer.url}/v2/swarm/background-${shape}/blobs/${blob.digest}?ns=${registry.host}`, {
          headers: { range: `bytes=${first}-${end - 1}`, ...(priority ? { [READ_PRIORITY_HEADER]: priority } : {}) },
        });
        assert.equal(response.statusCode, 206);
        const body = Buffer.from(await response.body.arrayBuffer());
        assert.ok(body.equals(bytes.subarray(first, end)), `bytes ${first}-${end - 1}`);
        return Date.now();
      };
      const readPiece = (peer: RunningPeerProcess, index: number) => read(peer, index * piece + 10, index * piece + 100);
      await readPiece(reader, 0); // the seed is triggered, and fetches on demand
      // One node fills its cache in the background, all of the blob (no whole download for all
      // that: nothing waits for it), while the other keeps reading for a workload.
      const background = read(filler, 0, blob.size, 'background');
      let lastDemand = 0;
      for (let index = 1; index <= 5; index++) {
        lastDemand = await readPiece(reader, index);
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
      const filled = await background;
      assert.ok(filled >= lastDemand, 'the background read ended after the reads a workload waited for');
      // Soon after the swarm's quiet period, not when the filler's stall would send it to the registry (60 s).
      assert.ok(
        filled - lastDemand < ON_DEMAND_QUIET_MS + 12_000,
        `the background read ended ${filled - lastDemand} ms after the last read on demand`,
      );
      // Every piece once from the registry, those only the background wanted last (its log may trail the reads).
      await waitFor(() => blobBytesSent(registry.requests(), blob.digest) >= blob.size, 10_000, 'the registry log');
      assert.equal(blobBytesSent(registry.requests(), blob.digest), blob.size, 'the registry sent the blob once');
      assert.ok(
        blobRequests(registry.requests(), blob.digest)
          .slice(0, 6)
          .every((r) => r.bytesWritten === piece),
        'the pieces read on demand came first, one request each',
      );
    });
  }

  it("a node whose background pieces wait for the swarm gives its parents' upload slots back to a node that reads for its workload", async () => {
    // One upload slot on the seed. The filler's background pieces wait while the reader reads on
    // demand; kept, its parents would hold the seed's slot, and the reader's next piece would wait
    // for the swarm to go quiet (ON_DEMAND_QUIET_MS) and the filler to finish.
    const { peers } = await cluster(2, { seedArgs: ['--upload-slots', '1'], schedulerArgs: ['--shape', 'mesh'] });
    const [reader, filler] = peers as [RunningPeerProcess, RunningPeerProcess];
    const name = 'swarm/background-gives-slot';
    const blob = await pushRandomBlob(registry, name, 30 * MB);
    const bytes = readFileSync(blob.path);
    const piece = 4 * 1024 * 1024;
    const read = rangeReader(name, blob, bytes);
    await read(reader, 10, 100); // the swarm reads on demand
    const background = read(filler, 0, blob.size, { [READ_PRIORITY_HEADER]: 'background' });
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    const started = Date.now();
    const readAgain = await read(reader, 3 * piece + 10, 3 * piece + 100);
    assert.ok(readAgain - started < ON_DEMAND_QUIET_MS / 2, `the workload's next read waited ${readAgain - started} ms`);
    const filled = await background;
    assert.ok(filled >= readAgain, 'the background read ended after the read a workload waited for');
    await waitFor(() => blobBytesSent(registry.requests(), blob.digest) >= blob.size, 10_000, 'the registry log');
    assert.equal(blobBytesSent(registry.requests(), blob.digest), blob.size, 'the registry sent the blob once');
  });

  it("a workload's read inside a piece its node fills in the background is not held with that piece", async () => {
    // The node's background fetch asked for the piece first; the swarm holds background pieces
    // while another node still reads for its start. The workload's few bytes come as a span at once.
    const { peers } = await cluster(2);
    const [reader, filler] = peers as [RunningPeerProcess, RunningPeerProcess];
    const name = 'swarm/background-then-demand';
    const blob = await pushRandomBlob(registry, name, 30 * MB);
    const bytes = readFileSync(blob.path);
    const piece = 4 * 1024 * 1024;
    const read = rangeReader(name, blob, bytes);
    const checked = { [READ_CHECKED_HEADER]: 'toc' };
    await read(reader, 10, 100, checked); // the seed is triggered, and the swarm reads on demand
    const background = read(filler, 0, blob.size, { [READ_PRIORITY_HEADER]: 'background' });
    // The reader keeps reading for its workload for 6 s: the background pieces wait all that time.
    const reading = (async () => {
      for (let index = 1; index <= 6; index++) {
        await read(reader, index * piece + 10, index * piece + 100, checked);
        await new Promise((resolve) => setTimeout(resolve, 1_000));
      }
    })();
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    const started = Date.now();
    await read(filler, 5 * piece + 1_000, 5 * piece + 2_000, checked);
    const waited = Date.now() - started;
    assert.ok(waited < 2_000, `the workload's read waited ${waited} ms`);
    assert.ok(
      (await filler.metric('starling_peer_span_bytes_total')) >= 1_000,
      'it came as a span, not with the piece the background read asked for',
    );
    await reading;
    await background;
  });

  it('a preheat still reads the whole blob, on a seed as on any peer', async () => {
    const scheduler = await startScheduler({ ip: ip() });
    running.push(scheduler);
    const seedIp = ip();
    const uploadPort = await freePort(seedIp);
    const seed = await startPeer({ ip: seedIp, uploadPort, schedulers: [scheduler.address], seed: true, insecure: [registry.host] });
    running.push(seed);
    const blob = await pushRandomBlob(registry, 'swarm/preheat-whole', 20 * MB);
    const { token } = await clusterToken();
    const headers = { authorization: `Bearer ${token}`, 'content-type': 'application/json' };
    const base = `http://${seedIp}:${uploadPort}`;
    const body: BlobFetchRequest = {
      taskId: blob.digest,
      contentLength: blob.size,
      pieceSize: pieceSizeFor(blob.size),
      origin: { url: `http://${registry.host}/v2/swarm/preheat-whole/blobs/${blob.digest}`, headers: {} },
    };
    const accepted = await request(`${base}${PREHEAT_PATH}`, { method: 'POST', headers, body: JSON.stringify(body) });
    assert.equal(accepted.statusCode, 202, await accepted.body.text());
    await waitFor(
      async () => {
        const response = await request(`${base}${preheatStatusPath(blob.digest)}`, { headers });
        return response.statusCode === 200 && ((await response.body.json()) as FetchStatus).complete;
      },
      30_000,
      'the preheat to complete',
    );
    assert.equal(blobBytesSent(registry.requests(), blob.digest), blob.size, 'the registry sent one whole copy');
  });

  for (const { shape, schedulerArgs } of shapes) {
    it(`completes every pull when the scheduler dies mid-run (${shape})`, async () => {
      const limit = ['--upload-rate-limit', '30MB'];
      const { scheduler, peers } = await cluster(4, { seedArgs: limit, peerArgs: limit, schedulerArgs });
      const repo = `swarm/no-scheduler-${shape}`;
      const blob = await pushRandomBlob(registry, repo, 64 * MB);
      const pulls = peers.map((peer) => pullThrough(peer, registry, repo, blob.digest));
      const stored = () => Promise.all(peers.map((peer) => peer.metric('starling_peer_storage_bytes')));
      // The scheduler goes once it has every piece's digest (the seed read them all) and every peer
      // has a parent (it stored a piece): the peers can then finish from their parents alone. A peer
      // lacking a digest, or still waiting for its first parent, reads the origin (as before).
      await waitFor(
        async () => (await taskStat(scheduler, blob.digest)).trustedDigests === Math.ceil(blob.size / (4 * 1024 * 1024)),
        60_000,
        "the seed's digests at the scheduler",
      );
      await waitFor(async () => (await stored()).every((bytes) => bytes >= 4 * MB), 60_000, 'every peer receiving pieces');
      await scheduler.service.kill9();
      assert.ok(Math.min(...(await stored())) < blob.size, 'the scheduler died mid-run');
      const results = await Promise.all(pulls);
      for (const result of results) assert.deepEqual(result, { status: 200, digest: blob.digest, bytes: blob.size });
      // The peers went on with the parents they had, not each to the registry (3.0-3.9 copies before).
      const copies = await registryCopies(registry, blob);
      assert.ok(copies < 2, `the registry sent ${copies.toFixed(2)} copies`);
      // And a pull that starts with no scheduler at all still works, from the origin.
      const other = await pushRandomBlob(registry, repo, 5 * MB);
      assert.equal((await pullThrough(itemAt(peers, 0), registry, repo, other.digest)).digest, other.digest);
    });
  }
});
