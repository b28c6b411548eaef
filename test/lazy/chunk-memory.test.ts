// The whole-chunk memory cache in front of the chunk store: LRU within a byte budget, reads
// answered from it, one disk read per chunk however many readers, preload.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import fsp from 'node:fs/promises';
import { after, before, test } from 'node:test';
import { ChunkMemoryCache, ChunkStore } from '../../src/lazy/chunk-store.js';
import { makeTempDir, type TempDir } from '../fixtures/processes.js';

let tmp: TempDir;
before(async () => {
  tmp = await makeTempDir('starling-chunk-memory-');
});
after(async () => tmp?.remove());

const digestOf = (data: Buffer) => `sha256:${createHash('sha256').update(data).digest('hex')}`;

test('the cache keeps the most recently used chunks within its budget', () => {
  const cache = new ChunkMemoryCache(100);
  const a = Buffer.alloc(20, 1);
  const b = Buffer.alloc(20, 2);
  const c = Buffer.alloc(20, 3);
  cache.set('a', a);
  cache.set('b', b);
  cache.set('c', c);
  assert.equal(cache.bytes, 60);
  cache.get('a'); // a is now the youngest
  cache.set('d', Buffer.alloc(20, 4));
  cache.set('e', Buffer.alloc(20, 5));
  cache.set('f', Buffer.alloc(20, 6)); // over budget: b (the oldest) goes
  assert.equal(cache.get('b'), undefined);
  assert.equal(cache.get('a'), a);
  assert.ok(cache.bytes <= 100);
  cache.set('huge', Buffer.alloc(26)); // more than a quarter of the budget: not kept
  assert.equal(cache.get('huge'), undefined);
  cache.delete('a');
  assert.equal(cache.get('a'), undefined);
});

test('store reads load a chunk once and answer later reads from memory', async () => {
  const memory = new ChunkMemoryCache(64 << 20);
  const store = await ChunkStore.open(`${tmp.path}/store`, { memory });
  const data = Buffer.from(Array.from({ length: 1 << 20 }, (_, i) => i % 251));
  const digest = digestOf(data);
  await store.write(digest, data);
  const [x, y] = await Promise.all([store.read(digest, 0, 1000, data.length), store.read(digest, 5000, 10, data.length)]);
  assert.deepEqual(x, data.subarray(0, 1000));
  assert.deepEqual(y, data.subarray(5000, 5010));
  assert.equal(memory.bytes, data.length, 'one whole chunk in memory');
  // Served from memory even if the file is gone (it was verified when stored).
  await fsp.rm(store.pathOf(digest));
  assert.deepEqual(await store.read(digest, 100, 5, data.length), data.subarray(100, 105));
  await store.close();
});

test('preload brings a stored chunk into memory without a reader waiting', async () => {
  const memory = new ChunkMemoryCache(64 << 20);
  const store = await ChunkStore.open(`${tmp.path}/preload`, { memory });
  const data = Buffer.alloc(4096, 7);
  const digest = digestOf(data);
  await store.write(digest, data);
  store.preload(digest, data.length);
  for (let i = 0; i < 100 && memory.bytes === 0; i++) await new Promise((r) => setTimeout(r, 5));
  assert.equal(memory.bytes, data.length);
  const none = await ChunkStore.open(`${tmp.path}/none`, { memory: null });
  await none.write(digest, data);
  assert.deepEqual(await none.read(digest, 0, 10, data.length), data.subarray(0, 10), 'works without a memory cache');
  await Promise.all([store.close(), none.close()]);
});
