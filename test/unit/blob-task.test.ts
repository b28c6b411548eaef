import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, it } from 'node:test';
import { itemAt } from '../../src/common/indexing.js';
import { silentLogger } from '../../src/common/log.js';
import { RateLimiter } from '../../src/common/rate-limiter.js';
import { digestOf } from '../../src/oci/digest.js';
import { RegistryTransport } from '../../src/oci/transport.js';
import { BlobTask, BlobDigestMismatchError } from '../../src/peer/blob-task.js';
import { pieceBuffers } from '../../src/peer/piece-buffers.js';
import { OriginSource } from '../../src/peer/sources/origin-source.js';
import { BlobStore } from '../../src/storage/blob-store.js';
import { MIN_PIECE_SIZE } from '../../src/storage/piece-plan.js';

/** A blob the test registry serves to anyone. */
const PUBLIC_SOURCE = { registry: 'http://127.0.0.1:5000', repository: 'test/blob', public: true };

/** A stand-in origin for this module's unit tests; the real registry is used in test/integration. */
interface FakeOrigin {
  url: URL;
  requests: Array<{ range?: string }>;
  close(): Promise<void>;
}

type Behaviour = 'honest' | 'ignore-range' | 'wrong-range' | 'drop-once';

async function startOrigin(data: Buffer, behaviour: Behaviour): Promise<FakeOrigin> {
  const requests: Array<{ range?: string }> = [];
  let dropped = false;
  const server: Server = createServer((req, res) => {
    requests.push({ range: req.headers.range });
    const match = /^bytes=(\d+)-(\d+)$/.exec(req.headers.range ?? '');
    if (behaviour === 'drop-once' && !dropped) {
      dropped = true;
      res.writeHead(200, { 'content-length': data.length });
      // Ends the connection once the bytes are out (FIN, not RST: a reset could drop bytes still
      // in flight, and the test would then depend on how fast this machine is).
      res.write(data.subarray(0, MIN_PIECE_SIZE + 10), () => res.socket?.end());
      return;
    }
    if (!match || behaviour === 'ignore-range') {
      res.writeHead(200, { 'content-length': data.length });
      return void res.end(data);
    }
    const start = Number(match[1]);
    const end = Number(match[2]);
    const shown = behaviour === 'wrong-range' ? `bytes ${start + 1}-${end}/${data.length}` : `bytes ${start}-${end}/${data.length}`;
    res.writeHead(206, { 'content-range': shown, 'content-length': end - start + 1 });
    res.end(data.subarray(start, end + 1));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: new URL(`http://127.0.0.1:${port}/v2/x/blobs/d`),
    requests,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

describe('BlobTask with an origin source', () => {
  let dir: string;
  let store: BlobStore;
  let transport: RegistryTransport;
  const data = randomBytes(3 * MIN_PIECE_SIZE + 1234);
  const digest = digestOf(data);
  const events = { pieceStored: () => undefined, verified: () => undefined, failed: () => undefined };

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'starling-task-'));
    store = await BlobStore.open(dir, { quota: 0, highWatermark: 0.9, lowWatermark: 0.7 }, silentLogger);
    transport = new RegistryTransport();
  });
  afterEach(async () => {
    await store.close();
    await transport.close();
    await rm(dir, { recursive: true, force: true });
  });

  async function makeTask(blobDigest = digest) {
    const blob = await store.create(blobDigest, data.length, PUBLIC_SOURCE);
    return new BlobTask(store, blob, silentLogger, events);
  }
  const source = (origin: FakeOrigin) => new OriginSource(origin.url, {}, transport, new RateLimiter(0), silentLogger);

  async function readAll(task: BlobTask): Promise<Buffer> {
    const out = Buffer.alloc(data.length);
    await task.blob.read(out, 0);
    return out;
  }

  it('fetches a whole blob once however many waiters ask, and verifies it', async () => {
    const origin = await startOrigin(data, 'honest');
    const task = await makeTask();
    const last = task.layout.pieceCount - 1;
    task.request(0, last, source(origin));
    task.request(0, last, source(origin));
    await Promise.all([task.waitForPiece(last), task.waitForPiece(0), task.whenPersisted()]);
    assert.equal(origin.requests.length, 1);
    assert.equal(itemAt(origin.requests, 0).range, undefined, 'a whole-blob run is a plain GET');
    assert.ok(task.complete);
    assert.ok((await readAll(task)).equals(data));
    await origin.close();
  });

  it('fetches only the pieces covering a range, with a Range request', async () => {
    const origin = await startOrigin(data, 'honest');
    const task = await makeTask();
    task.request(1, 2, source(origin));
    await task.waitForPiece(2);
    assert.deepEqual(origin.requests, [{ range: `bytes=${MIN_PIECE_SIZE}-${3 * MIN_PIECE_SIZE - 1}` }]);
    assert.ok(!task.hasPiece(0) && !task.hasPiece(3));
    await origin.close();
  });

  it('knows the pieces on their way that only background readers want, until a reader waits for one or it is stored', async () => {
    const origin = await startOrigin(data, 'honest');
    const task = await makeTask();
    task.request(1, 2, source(origin), 'background');
    assert.ok(task.wantedInBackgroundOnly(1) && task.wantedInBackgroundOnly(2));
    // Before any byte arrives, a piece asked for in the background only is no piece on its way for
    // a reader that waits: such a read takes a span rather than wait with it (mirror/blobs.ts).
    assert.ok(!task.holdsOrFetchesOnDemand(1) && !task.holdsOrFetchesOnDemand(0));
    task.request(2, 3, source(origin));
    assert.ok(task.wantedInBackgroundOnly(1), 'still wanted in the background only');
    assert.ok(!task.wantedInBackgroundOnly(2), 'a reader waits for it now');
    assert.ok(!task.wantedInBackgroundOnly(3));
    assert.ok(task.holdsOrFetchesOnDemand(2) && task.holdsOrFetchesOnDemand(3));
    task.request(3, 3, source(origin), 'background');
    assert.ok(!task.wantedInBackgroundOnly(3), 'a background reader does not demote a piece a reader waits for');
    await Promise.all([task.waitForPiece(1), task.waitForPiece(3)]);
    assert.ok(!task.wantedInBackgroundOnly(1), 'stored: wanted no more');
    assert.ok(task.holdsOrFetchesOnDemand(1), 'stored');
    await origin.close();
  });

  it('detects an origin that ignores Range and takes its bytes from the start of the blob', async () => {
    const origin = await startOrigin(data, 'ignore-range');
    const task = await makeTask();
    task.request(2, 2, source(origin));
    await task.waitForPiece(2);
    await task.whenPersisted();
    assert.ok((await readAll(task)).equals(data));
    await origin.close();
  });

  it('does not trust a Content-Range other than the one asked for', async () => {
    const origin = await startOrigin(data, 'wrong-range');
    const task = await makeTask();
    task.request(1, 1, source(origin));
    await assert.rejects(task.waitForPiece(1), /Content-Range "bytes \d+-\d+\/\d+"/);
    assert.ok(!task.hasPiece(1));
    await origin.close();
  });

  it('resumes a broken download from the first missing piece', async () => {
    const origin = await startOrigin(data, 'drop-once');
    const task = await makeTask();
    task.request(0, task.layout.pieceCount - 1, source(origin));
    await task.whenPersisted();
    assert.equal(origin.requests.length, 2);
    assert.equal(origin.requests[1]?.range, `bytes=${MIN_PIECE_SIZE}-${data.length - 1}`);
    assert.ok((await readAll(task)).equals(data));
    await origin.close();
  });

  /** Every piece on disk, then a fresh store: the task hashes them by reading them back. */
  async function storedBeforeRestart() {
    const blob = await store.create(digest, data.length, PUBLIC_SOURCE);
    const layout = blob.layout;
    for (let index = 0; index < layout.pieceCount; index++) {
      const bytes = data.subarray(index * layout.pieceSize, Math.min(data.length, (index + 1) * layout.pieceSize));
      await store.writePiece(blob, index, bytes, createHash('sha256').update(bytes).digest('hex'));
    }
    await store.close();
    store = await BlobStore.open(dir, { quota: 0, highWatermark: 0.9, lowWatermark: 0.7 }, silentLogger);
    const loaded = store.get(digest);
    assert.ok(loaded, `the reopened store holds ${digest}`);
    return loaded;
  }

  it('verifies a blob whose pieces were all stored before a restart cut its verification short', async () => {
    const loaded = await storedBeforeRestart();
    assert.ok(loaded && !loaded.complete && loaded.storedPieceCount === loaded.layout.pieceCount);
    const task = new BlobTask(store, loaded, silentLogger, events);
    await task.whenPersisted(); // no piece will arrive: the task must verify on its own
    assert.ok(task.complete);
    assert.ok((await readAll(task)).equals(data));
  });

  /** Settles within `ms`, or fails the test instead of hanging it. */
  function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what} did not settle within ${ms} ms`)), ms);
    });
    return Promise.race([promise, late]).finally(() => clearTimeout(timer));
  }

  it('fails, rather than hangs, a blob whose stored piece cannot be read back for its hash', async () => {
    const loaded = await storedBeforeRestart();
    loaded.read = async () => {
      throw new Error('EIO: i/o error, read');
    };
    const task = new BlobTask(store, loaded, silentLogger, events);
    await assert.rejects(within(task.whenVerified(), 5000, 'verification'), (error: Error) => {
      assert.equal(error.name, 'BlobHashError');
      assert.match(error.message, /at piece 0: EIO/);
      return true;
    });
    await assert.rejects(within(task.whenPersisted(), 5000, 'persistence'), /EIO/);
    assert.equal(store.get(digest), undefined, 'the blob is discarded, to be fetched again');
  });

  it('names a stored piece that reads back short instead of hashing stale buffer bytes', async () => {
    const loaded = await storedBeforeRestart();
    const read = loaded.read.bind(loaded);
    loaded.read = async (target, position, length) => Math.min(await read(target, position, length), 1000);
    const task = new BlobTask(store, loaded, silentLogger, events);
    await assert.rejects(
      within(task.whenVerified(), 5000, 'verification'),
      /piece 0 of sha256:[0-9a-f]{64} reads back 1000 of its 4194304 bytes/,
    );
  });

  it('reuses piece buffers once every holder let go, and the blob still verifies byte-exact', async () => {
    const big = randomBytes(12 * MIN_PIECE_SIZE + 77);
    const origin = await startOrigin(big, 'honest');
    const blob = await store.create(digestOf(big), big.length, PUBLIC_SOURCE);
    const task = new BlobTask(store, blob, silentLogger, events);
    const reusedBefore = pieceBuffers.reused;
    task.request(0, task.layout.pieceCount - 1, source(origin));
    await task.whenPersisted();
    const out = Buffer.alloc(big.length);
    await task.blob.read(out, 0);
    assert.ok(out.equals(big));
    assert.ok(pieceBuffers.reused - reusedBefore >= 4, `buffers reused: ${pieceBuffers.reused - reusedBefore}`);
    await origin.close();
  });

  it('counts a piece from parents as verified only once the scheduler confirms its digest, whenever it is stored', async () => {
    const task = await makeTask();
    const piece = (index: number) => data.subarray(index * MIN_PIECE_SIZE, Math.min(data.length, (index + 1) * MIN_PIECE_SIZE));
    const sha = (bytes: Buffer) => createHash('sha256').update(bytes).digest('hex');
    // Checked against an origin reader's digest (the registry's word): stored, not verified.
    await task.storePiece(0, piece(0), { from: 'seed', parentId: 'seed-1', sha256: sha(piece(0)) });
    await task.storePiece(1, Buffer.alloc(piece(1).length, 7), {
      from: 'peer',
      parentId: 'p',
      sha256: sha(Buffer.alloc(piece(1).length, 7)),
    });
    assert.equal(task.pieceVerified(0), false);
    assert.equal(task.pieceServable(0), true, 'served to later requests naming its registry: the swarm read it there');
    assert.ok(task.holdsUnverifiedPieces());
    task.confirmPieces({ 0: `sha256:${sha(piece(0))}`, 1: `sha256:${sha(piece(1))}`, 2: `sha256:${sha(piece(2))}` });
    assert.equal(task.pieceVerified(0), true, 'its digest is confirmed');
    assert.equal(task.pieceVerified(1), false, 'a piece whose bytes are not the confirmed ones stays unverified');
    await task.storePiece(2, piece(2), { from: 'origin' });
    assert.equal(task.pieceVerified(2), true, 'a piece stored after the confirmation, from anywhere, matching it');
    await task.fail(new Error('done'));
  });

  it('discards a blob whose bytes do not match its digest', async () => {
    const origin = await startOrigin(data, 'honest');
    const task = await makeTask(digestOf('something else'));
    task.request(0, task.layout.pieceCount - 1, source(origin));
    await assert.rejects(task.whenVerified(), BlobDigestMismatchError);
    assert.equal(store.get(task.digest), undefined, 'nothing stays stored');
    assert.equal(store.usedBytes, 0);
    await origin.close();
  });
});
