import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { appendFile, mkdtemp, open, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import { afterEach, beforeEach, describe, it } from 'node:test';
import { silentLogger } from '../../src/common/log.js';
import { digestOf } from '../../src/oci/digest.js';
import { BlobStore } from '../../src/storage/blob-store.js';
import type { StoredBlob } from '../../src/storage/stored-blob.js';
import { pieceCheck } from '../../src/storage/piece-check.js';
import { MIN_PIECE_SIZE, pieceBounds, pieceLayout, pieceSizeFor, piecesCovering } from '../../src/storage/piece-plan.js';
import { itemAt } from '../../src/common/indexing.js';

/** A blob the test registry serves to anyone. */
const PUBLIC_SOURCE = { registry: 'http://127.0.0.1:5000', repository: 'test/blob', public: true };

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const noQuota = { quota: 0, highWatermark: 0.9, lowWatermark: 0.7 };

describe('piece plan', () => {
  it('uses 4 MiB pieces for ordinary blobs and grows them for huge ones', () => {
    assert.equal(pieceSizeFor(0), MIN_PIECE_SIZE);
    assert.equal(pieceSizeFor(1e9), MIN_PIECE_SIZE);
    assert.equal(pieceSizeFor(21.4e9), 32 * 2 ** 20);
    assert.equal(pieceSizeFor(1e13), 64 * 2 ** 20);
  });
  it('covers every byte exactly once', () => {
    const layout = pieceLayout(10 * MIN_PIECE_SIZE + 5);
    assert.equal(layout.pieceCount, 11);
    assert.deepEqual(pieceBounds(layout, 10), { offset: 10 * MIN_PIECE_SIZE, length: 5 });
    assert.deepEqual(piecesCovering(layout, MIN_PIECE_SIZE - 1, MIN_PIECE_SIZE), { first: 0, last: 1 });
    assert.equal(pieceLayout(0).pieceCount, 1);
  });
});

describe('BlobStore', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'starling-store-'));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  for (const kind of ['sha256', 'crc'] as const)
    it(`keeps verified pieces across a restart and drops torn ones (${kind} piece checks)`, async () => {
      const size = 2 * MIN_PIECE_SIZE + 100;
      const data = randomBytes(size);
      const digest = digestOf(data);
      let store = await BlobStore.open(dir, noQuota, silentLogger);
      const blob = await store.create(digest, size, PUBLIC_SOURCE);
      const layout = blob.layout;
      for (const index of [0, 2]) {
        const { offset, length } = pieceBounds(layout, index);
        const piece = data.subarray(offset, offset + length);
        await store.writePiece(blob, index, Buffer.from(piece), await pieceCheck(kind, piece));
        if (kind === 'crc') assert.equal(blob.pieceDigest(index), undefined, 'a CRC is not a digest to hand out');
      }
      await store.close();

      // Simulate a crash that journaled piece 1 but never wrote its bytes, and tore piece 2's bytes.
      await appendFile(
        join(blob.dir, 'pieces'),
        `1 ${await pieceCheck(kind, data.subarray(MIN_PIECE_SIZE, 2 * MIN_PIECE_SIZE))}\n3 garbage\n`,
      );
      const handle = await open(join(blob.dir, 'data'), 'r+');
      await handle.write(Buffer.from('torn'), 0, 4, 2 * MIN_PIECE_SIZE);
      await handle.close();

      store = await BlobStore.open(dir, noQuota, silentLogger);
      const reloaded = store.get(digest);
      assert.ok(reloaded, 'the blob is still known');
      assert.ok(reloaded.hasPiece(0), 'verified piece kept');
      assert.ok(!reloaded.hasPiece(1), 'piece never written is dropped');
      assert.ok(!reloaded.hasPiece(2), 'torn piece is dropped');
      assert.equal(store.usedBytes, MIN_PIECE_SIZE);
      assert.ok(!reloaded.complete);
      await store.close();
    });

  it("still recognizes pieces journaled with an earlier build's CRC-32, and drops a CRC that does not match", async () => {
    const size = 2 * MIN_PIECE_SIZE;
    const data = randomBytes(size);
    const digest = digestOf(data);
    let store = await BlobStore.open(dir, noQuota, silentLogger);
    const blob = await store.create(digest, size, PUBLIC_SOURCE);
    const [first, second] = [data.subarray(0, MIN_PIECE_SIZE), data.subarray(MIN_PIECE_SIZE, 2 * MIN_PIECE_SIZE)];
    const crc = (bytes: Uint8Array) => `crc32:${(crc32(bytes) >>> 0).toString(16).padStart(8, '0')}`;
    await store.writePiece(blob, 0, Buffer.from(first), crc(first));
    await store.writePiece(blob, 1, Buffer.from(second), crc(first)); // a check of other bytes
    await store.close();

    store = await BlobStore.open(dir, noQuota, silentLogger);
    const reloaded = store.get(digest);
    assert.ok(reloaded, 'the blob is still known');
    assert.ok(reloaded.hasPiece(0), 'a CRC-32 piece from an earlier build is kept');
    assert.ok(!reloaded.hasPiece(1), 'a piece whose CRC does not match is dropped');
    await store.close();
  });

  it('refuses a piece of the wrong length', async () => {
    const store = await BlobStore.open(dir, noQuota, silentLogger);
    const blob = await store.create(digestOf('abc'), 3, PUBLIC_SOURCE);
    await assert.rejects(store.writePiece(blob, 0, Buffer.from('abcd'), 'x'), /has 4 bytes, expected 3/);
    await store.close();
  });

  it('discards unreadable blob directories at start-up', async () => {
    let store = await BlobStore.open(dir, noQuota, silentLogger);
    const blob = await store.create(digestOf('abc'), 3, PUBLIC_SOURCE);
    await store.close();
    await appendFile(join(blob.dir, 'meta.json'), '}}}');
    store = await BlobStore.open(dir, noQuota, silentLogger);
    assert.equal(store.blobCount, 0);
    await store.close();
  });

  it('evicts least recently used blobs down to the low watermark, never one in use', async () => {
    const quota = { quota: 10 * 1024, highWatermark: 0.9, lowWatermark: 0.5 };
    const evicted: string[] = [];
    const store = await BlobStore.open(dir, quota, silentLogger, (event) => evicted.push(event.digest));
    const blobs: StoredBlob[] = [];
    for (let i = 0; i < 4; i++) {
      const bytes = randomBytes(2 * 1024);
      const blob = await store.create(digestOf(bytes), bytes.length, PUBLIC_SOURCE);
      blob.lastAccess = i; // oldest first
      await store.writePiece(blob, 0, bytes, sha(bytes));
      blobs.push(blob);
    }
    const release = store.acquire(itemAt(blobs, 0).digest); // the oldest is in use
    const bytes = randomBytes(2 * 1024);
    const newest = await store.create(digestOf(bytes), bytes.length, PUBLIC_SOURCE);
    newest.lastAccess = Date.now();
    await store.writePiece(newest, 0, bytes, sha(bytes)); // 10 KiB > 9 KiB high watermark
    assert.deepEqual(
      evicted,
      [1, 2, 3].map((i) => itemAt(blobs, i).digest),
    );
    assert.ok(store.get(itemAt(blobs, 0).digest), 'blob in use survives');
    assert.ok(store.usedBytes <= 5 * 1024);
    release();
    await store.close();
  });

  it('evicts a blob that was spared while in use as soon as it is released, without waiting for another write', async () => {
    const quota = { quota: 10 * 1024, highWatermark: 0.9, lowWatermark: 0.5 };
    const evicted: string[] = [];
    const store = await BlobStore.open(dir, quota, silentLogger, (event) => evicted.push(event.digest));
    const bytes = randomBytes(9.5 * 1024);
    const blob = await store.create(digestOf(bytes), bytes.length, PUBLIC_SOURCE);
    const release = store.acquire(blob.digest);
    await store.writePiece(blob, 0, bytes, sha(bytes)); // over the high watermark, but in use
    assert.deepEqual(evicted, []);
    release();
    await waitUntil(() => evicted.length === 1);
    assert.deepEqual(evicted, [blob.digest]);
    assert.equal(store.usedBytes, 0);
    await store.close();
  });

  it('refuses a blob larger than its quota, or than the file system allows, with an error naming the size', async () => {
    const limited = await BlobStore.open(dir, { quota: 1024 * 1024, highWatermark: 0.9, lowWatermark: 0.5 }, silentLogger);
    await assert.rejects(
      limited.create(digestOf('huge'), 2 ** 50, PUBLIC_SOURCE),
      /announced with 1125899906842624 bytes, more than this peer's disk quota of 1048576 bytes/,
    );
    await limited.close();
    const unlimited = await BlobStore.open(dir, noQuota, silentLogger);
    await assert.rejects(
      unlimited.create(digestOf('huge'), 2 ** 52, PUBLIC_SOURCE),
      /announced with 4503599627370496 bytes, more than this peer's disk can hold in one file \(EFBIG\)/,
    );
    assert.equal(unlimited.blobCount, 0, 'nothing is left behind');
    await unlimited.close();
  });
});

async function waitUntil(predicate: () => boolean): Promise<void> {
  for (let i = 0; i < 200 && !predicate(); i++) await new Promise((resolve) => setTimeout(resolve, 10));
}
