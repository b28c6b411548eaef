import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, beforeEach, describe, it } from 'node:test';
import { Agent, request } from 'undici';
import { silentLogger } from '../../src/common/log.js';
import { RegistryTransport } from '../../src/oci/transport.js';
import { AccessChecker } from '../../src/peer/access/checker.js';
import { RateLimiter } from '../../src/common/rate-limiter.js';
import { digestOf } from '../../src/oci/digest.js';
import type { BlobTask } from '../../src/peer/blob-task.js';
import { TaskManager } from '../../src/peer/task-manager.js';
import { decodeBitmap, PieceBoard } from '../../src/peer/upload/piece-board.js';
import type { PieceSource } from '../../src/peer/sources/piece-source.js';
import { UploadService, type PiecesOnDemand } from '../../src/peer/upload/server.js';
import { BlobStore } from '../../src/storage/blob-store.js';
import { MIN_PIECE_SIZE } from '../../src/storage/piece-plan.js';
import { ClusterToken } from '../../src/common/token.js';
import { pieceRequestPath, type PieceWish } from '../../src/rpc/upload-api.js';

const TOKEN = 'relay-test-cluster-token-0123456789';

/** A blob the test registry serves to anyone. */
const PUBLIC_SOURCE = { registry: 'http://127.0.0.1:5000', repository: 'test/blob', public: true };

/**
 * Cut-through: the upload server relays a piece while it is still arriving at this peer, holds
 * back its last byte until the piece is stored, and cuts the response short when the fetch it
 * relays gives up.
 */
describe('upload server relaying pieces on their way', () => {
  let dir: string;
  let store: BlobStore;
  let tasks: TaskManager;
  let board: PieceBoard;
  let server: Server;
  let base: string;
  /** What the peer fetches for children on demand (a triggered seed); none unless a test sets it. */
  let demand: PiecesOnDemand | undefined;
  const data = randomBytes(2 * MIN_PIECE_SIZE);
  const digest = digestOf(data);
  /** What a child sends: the cluster token, and the blob URL its client named. */
  const AUTH = {
    authorization: `Bearer ${TOKEN}`,
    'x-starling-origin': `${PUBLIC_SOURCE.registry}/v2/${PUBLIC_SOURCE.repository}/blobs/${digest}`,
  };

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'starling-relay-'));
    store = await BlobStore.open(dir, { quota: 0, highWatermark: 0.9, lowWatermark: 0.7 }, silentLogger);
    board = new PieceBoard();
    tasks = new TaskManager(store, silentLogger, {
      pieceStored: (task) => board.notify(task.digest),
      pieceGrowing: (task) => board.notify(task.digest),
      verified: () => undefined,
      failed: () => undefined,
    });
    const uploads = new UploadService({
      tasks,
      board,
      limiter: new RateLimiter(0),
      slots: 4,
      clusterToken: ClusterToken.of(TOKEN),
      access: new AccessChecker(new RegistryTransport(), silentLogger),
      log: silentLogger,
      onUploaded: () => undefined,
      onDemand: {
        offers: (d) => demand?.offers(d) ?? false,
        demanded: () => demand?.demanded(),
        fetch: (task, index, wish) => demand?.fetch(task, index, wish) ?? 'not-offered',
      },
    });
    demand = undefined;
    server = createServer(uploads.handle);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterEach(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
    await store.close();
    await rm(dir, { recursive: true, force: true });
  });

  const openTask = async (): Promise<BlobTask> =>
    (await tasks.open(digest, async () => ({ size: data.length, source: PUBLIC_SOURCE }))).task;

  /** Reads a piece response, recording how many bytes had come when `mark` was called. */
  async function readPiece(index: number) {
    const response = await request(`${base}/_starling/pieces/${digest}/${index}`, { headers: AUTH });
    const chunks: Buffer[] = [];
    let received = 0;
    const done = (async () => {
      for await (const chunk of response.body as AsyncIterable<Buffer>) {
        chunks.push(chunk);
        received += chunk.length;
      }
      return Buffer.concat(chunks);
    })();
    done.catch(() => undefined);
    return { status: response.statusCode, received: () => received, done };
  }

  it('relays the bytes that have arrived, then the rest once the piece is stored', async () => {
    const task = await openTask();
    const piece = task.beginPiece(1);
    const half = MIN_PIECE_SIZE / 2;
    data.copy(piece.buffer, 0, MIN_PIECE_SIZE, MIN_PIECE_SIZE + half);
    piece.advance(half);

    const bitmap = (await (await request(`${base}/_starling/tasks/${digest}/pieces`, { headers: AUTH })).body.json()) as {
      bitmap: string;
      growing: string;
      version: number;
    };
    assert.deepEqual([...decodeBitmap(bitmap.growing, 2)], [1], 'the piece on its way is offered');
    assert.deepEqual([...decodeBitmap(bitmap.bitmap, 2)], [], 'but not as held');

    const reading = await readPiece(1);
    assert.equal(reading.status, 200);
    for (let i = 0; i < 100 && reading.received() < half; i++) await sleep(10);
    assert.equal(reading.received(), half, 'the first half came before the piece was complete');

    data.copy(piece.buffer, half, MIN_PIECE_SIZE + half, 2 * MIN_PIECE_SIZE);
    piece.advance(MIN_PIECE_SIZE);
    await sleep(50);
    assert.equal(reading.received(), MIN_PIECE_SIZE - 1, 'the last byte waits for the piece to be stored');

    await task.storePiece(1, piece.buffer, { from: 'peer' });
    piece.end();
    assert.ok((await reading.done).equals(data.subarray(MIN_PIECE_SIZE)), 'the relayed piece is byte for byte the stored one');
  });

  it('cuts the response short when the relayed fetch gives up', async () => {
    const task = await openTask();
    const piece = task.beginPiece(0);
    data.copy(piece.buffer, 0, 0, 100_000);
    piece.advance(100_000);
    const reading = await readPiece(0);
    for (let i = 0; i < 100 && reading.received() === 0; i++) await sleep(10);
    assert.ok(reading.received() > 0, 'some bytes were relayed');
    piece.end(); // never stored
    await assert.rejects(reading.done, 'a piece that was given up never reaches the child whole');
    assert.ok(!task.isGrowing(0));
    const after = await request(`${base}/_starling/pieces/${digest}/0`, { headers: AUTH });
    assert.equal(after.statusCode, 404, 'nothing is offered any more');
    await after.body.dump();
  });

  it('wakes a bitmap long poll when a piece starts arriving', async () => {
    const task = await openTask();
    const first = (await (await request(`${base}/_starling/tasks/${digest}/pieces`, { headers: AUTH })).body.json()) as { version: number };
    const polling = request(`${base}/_starling/tasks/${digest}/pieces?known=${first.version}&wait=5000`, { headers: AUTH });
    await sleep(50);
    const started = Date.now();
    const piece = task.beginPiece(1);
    const answer = (await (await polling).body.json()) as { growing: string; version: number };
    assert.ok(Date.now() - started < 2000, 'answered at once, not at the end of the wait');
    assert.ok(answer.version > first.version);
    assert.deepEqual([...decodeBitmap(answer.growing, 2)], [1]);
    piece.end();
  });
  it('leaves no close listener behind on a kept-alive connection after many long polls', async () => {
    await openTask();
    let socket: import('node:net').Socket | undefined;
    server.once('connection', (s) => (socket = s));
    const agent = new Agent({ connections: 1 });
    try {
      for (let i = 0; i < 30; i++) {
        const { version } = (await (
          await request(`${base}/_starling/tasks/${digest}/pieces`, { headers: AUTH, dispatcher: agent })
        ).body.json()) as { version: number };
        const waited = await request(`${base}/_starling/tasks/${digest}/pieces?known=${version}&wait=1`, {
          headers: AUTH,
          dispatcher: agent,
        });
        await waited.body.dump();
      }
      assert.ok(socket, 'the polls shared one connection');
      assert.ok(socket.listenerCount('close') < 5, `close listeners on the connection: ${socket.listenerCount('close')}`);
    } finally {
      await agent.close();
    }
  });
  /** A source that hands each piece's bytes over in two halves, the second when `release` is called; counts its reads. */
  function slowSource(failWith?: Error) {
    const reads: number[] = [];
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const source: PieceSource = {
      kind: 'peer',
      description: 'test swarm',
      fetchRun: async (layout, run, sink, _signal, buffers) => {
        for (let index = run.first; index <= run.last; index++) {
          reads.push(index);
          if (failWith) throw failWith;
          assert.ok(buffers, 'the relay hands the source its piece buffers');
          const piece = buffers(index);
          const bytes = data.subarray(index * MIN_PIECE_SIZE, (index + 1) * MIN_PIECE_SIZE);
          bytes.copy(piece.buffer, 0, 0, MIN_PIECE_SIZE / 2);
          piece.advance(MIN_PIECE_SIZE / 2);
          await released;
          bytes.copy(piece.buffer, MIN_PIECE_SIZE / 2, MIN_PIECE_SIZE / 2);
          piece.advance(MIN_PIECE_SIZE);
          await sink(index, Buffer.from(piece.buffer.subarray(0, MIN_PIECE_SIZE)));
          piece.end();
        }
      },
    };
    return { source, reads, release: () => release() };
  }

  /** The peer seeds the task on demand through `source`, as Swarm.fetchForChild does. */
  const seedOnDemand = (source: PieceSource, putOff = false): { wishes: PieceWish[]; demanded: () => number } => {
    const wishes: PieceWish[] = [];
    let demanded = 0;
    demand = {
      offers: (d) => d === digest,
      demanded: () => void demanded++,
      fetch: (task, index, wish) => {
        wishes.push(wish);
        if (putOff && wish.background) return 'put-off';
        task.request(index, index, source);
        return 'fetching';
      },
    };
    return { wishes, demanded: () => demanded };
  };

  it('on demand: a piece not held is fetched when a child asks, once for two children, and relayed as it arrives', async () => {
    await openTask();
    const { source, reads, release } = slowSource();
    seedOnDemand(source);
    const bitmap = (await (await request(`${base}/_starling/tasks/${digest}/pieces`, { headers: AUTH })).body.json()) as {
      bitmap: string;
      onDemand: boolean;
    };
    assert.equal(bitmap.onDemand, true, 'the bitmap says every piece can be asked for');
    assert.deepEqual([...decodeBitmap(bitmap.bitmap, 2)], [], 'though none is held');

    const first = await readPiece(1);
    const second = await readPiece(1);
    assert.equal(first.status, 200);
    assert.equal(second.status, 200);
    for (let i = 0; i < 100 && (first.received() < MIN_PIECE_SIZE / 2 || second.received() < MIN_PIECE_SIZE / 2); i++) await sleep(10);
    assert.equal(first.received(), MIN_PIECE_SIZE / 2, 'the first half is relayed before the piece is whole');
    release();
    const expected = data.subarray(MIN_PIECE_SIZE);
    assert.ok((await first.done).equals(expected));
    assert.ok((await second.done).equals(expected));
    assert.deepEqual(reads, [1], 'one fetch of the piece for both children, none of the other piece');
  });

  it("on demand: a background piece put off answers 503 and fetches nothing; the child's wish reaches the seed", async () => {
    await openTask();
    const { source, reads, release } = slowSource();
    const seed = seedOnDemand(source, true);
    const putOff = await request(`${base}${pieceRequestPath(digest, 0, { wholeBlob: false, background: true })}`, { headers: AUTH });
    assert.equal(putOff.statusCode, 503);
    assert.match(((await putOff.body.json()) as { error: string }).error, /background piece 0 put off/);
    assert.deepEqual(reads, [], 'nothing was fetched for a piece put off');
    assert.equal(seed.demanded(), 0, 'a background request is not a read a workload waits for');
    release();
    const wanted = await request(`${base}${pieceRequestPath(digest, 1, { wholeBlob: true, background: false })}`, { headers: AUTH });
    assert.equal(wanted.statusCode, 200);
    assert.ok(Buffer.from(await wanted.body.arrayBuffer()).equals(data.subarray(MIN_PIECE_SIZE)));
    assert.deepEqual(seed.wishes, [
      { wholeBlob: false, background: true },
      { wholeBlob: true, background: false },
    ]);
    assert.equal(seed.demanded(), 1);
  });

  it('on demand: a fetch that fails answers 502 naming why; a peer not seeding on demand answers 404', async () => {
    await openTask();
    const missing = await request(`${base}/_starling/pieces/${digest}/0`, { headers: AUTH });
    assert.equal(missing.statusCode, 404);
    await missing.body.dump();
    seedOnDemand(slowSource(new Error('registry unreachable')).source);
    const failed = await request(`${base}/_starling/pieces/${digest}/0`, { headers: AUTH });
    assert.equal(failed.statusCode, 502);
    assert.match(
      ((await failed.body.json()) as { error: string }).error,
      /piece 0: fetching it from the origin failed: .*registry unreachable/,
    );
  });
});
