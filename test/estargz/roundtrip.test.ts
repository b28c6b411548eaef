import assert from 'node:assert/strict';
import { test } from 'node:test';
import { gunzipSync, gzipSync } from 'node:zlib';
import { bufferSource, openEstargz, verifyEstargz, type EstargzReader } from '../../src/estargz/index.js';
import { ustarFileHeader } from '../../src/estargz/tar.js';
import { build, cleanName, entryOf, everyTypeEntries, readTarOracle, sha256hex, type OracleEntry } from './helpers.js';
import { makeTar } from '../fixtures/tar.js';
import { itemAt } from '../../src/common/indexing.js';

const CHUNK = 64 * 1024;

/** Every entry the oracle sees in the input tar must come out of the reader identically. */
async function assertMatchesOracle(reader: EstargzReader, oracle: Map<string, OracleEntry>): Promise<void> {
  for (const expected of oracle.values()) {
    const entry = reader.lookup(expected.name);
    assert.ok(entry, `missing ${expected.name}`);
    assert.equal(entry.type, expected.type, expected.name);
    assert.equal(entry.size, expected.size, expected.name);
    assert.equal(entry.mode, expected.mode, expected.name);
    assert.equal(entry.uid, expected.uid, expected.name);
    assert.equal(entry.gid, expected.gid, expected.name);
    if (expected.type === 'symlink' || expected.type === 'hardlink') assert.equal(entry.linkName, expected.linkName, expected.name);
    if (expected.type === 'char' || expected.type === 'block') {
      assert.deepEqual([entry.devMajor, entry.devMinor], [expected.devMajor, expected.devMinor], expected.name);
    }
    assert.deepEqual(Object.fromEntries(Object.entries(entry.xattrs).map(([k, v]) => [k, v.toString()])), expected.xattrs, expected.name);
    if (expected.type === 'reg') {
      const content = await reader.readFile(expected.name);
      assert.equal(sha256hex(content), expected.sha256, expected.name);
      assert.equal(entry.digest, `sha256:${expected.sha256}`);
    }
    if (expected.type === 'hardlink') {
      const target = oracle.get(cleanName(expected.linkName));
      assert.ok(target, `${expected.name} links to ${expected.linkName}, which the tar has`);
      assert.equal(sha256hex(await reader.readFile(expected.name)), target.sha256);
    }
  }
}

test('round trip: every entry type, long names, xattrs, chunked files; the blob is a valid tar.gz', async () => {
  const tar = await makeTar(everyTypeEntries(CHUNK));
  const oracle = await readTarOracle(tar);
  const { blob, result } = await build(tar, { chunkSize: CHUNK });
  assert.equal(result.size, blob.length);
  assert.equal(result.digest, `sha256:${sha256hex(blob)}`);

  const reader = await openEstargz(bufferSource(blob), { tocDigest: result.tocDigest });
  await assertMatchesOracle(reader, oracle);
  assert.equal(reader.entries[0]?.name, '.no.prefetch.landmark');
  assert.deepEqual(await reader.readFile('.no.prefetch.landmark'), Buffer.from([0x0f]));
  assert.equal(reader.prefetchRange(), undefined);
  assert.equal(reader.lookup('d/big.bin')?.chunks.length, 6);
  assert.equal(reader.lookup('d/exact.bin')?.chunks.length, 2);
  // Go records chunkSize on every chunk but a short last one.
  const toc = reader.toc.entries.filter((e) => e.name === 'd/exact.bin' || e.name === 'd/big.bin');
  assert.deepEqual(
    toc.map((e) => e.chunkSize ?? 0),
    [CHUNK, CHUNK, CHUNK, CHUNK, CHUNK, 0, CHUNK, CHUNK],
  );

  // A plain gunzip of the whole blob is a tar holding the same files plus the TOC.
  const plain = gunzipSync(blob);
  assert.equal(plain.length, result.uncompressedSize);
  assert.equal(`sha256:${sha256hex(plain)}`, result.diffID);
  const unpacked = await readTarOracle(plain);
  for (const [name, expected] of oracle) assert.equal(unpacked.get(name)?.sha256, expected.sha256, name);
  assert.ok(unpacked.has('stargz.index.json'));

  const verified = await verifyEstargz(bufferSource(blob), { tocDigest: result.tocDigest });
  assert.equal(verified.diffID, result.diffID);
  assert.equal(verified.uncompressedSize, result.uncompressedSize);
  assert.equal(verified.chunks, reader.chunks.length);
});

test('ranges read only what they need and are verified', async () => {
  const tar = await makeTar(everyTypeEntries(CHUNK));
  const { blob } = await build(tar, { chunkSize: CHUNK });
  const content = (await readTarOracle(tar)).get('d/big.bin')?.content;
  assert.ok(content, 'the tar holds d/big.bin');
  let fetched = 0;
  const source = bufferSource(blob);
  const counting = { size: source.size, read: (o: number, l: number) => ((fetched += l), source.read(o, l)) };
  const reader = await openEstargz(counting);
  fetched = 0;
  for (const [offset, length] of [
    [0, 10],
    [CHUNK - 5, 10],
    [3 * CHUNK + 7, 2 * CHUNK],
    [content.length - 3, 100],
    [content.length, 5],
  ] as const) {
    const got = await reader.readRange('d/big.bin', offset, length);
    assert.deepEqual(got, content.subarray(offset, offset + length), `${offset}+${length}`);
  }
  assert.ok(fetched < 9 * CHUNK, `fetched ${fetched} bytes`);
  fetched = 0;
  await reader.readRange('/d/big.bin', 4 * CHUNK + 1, 1);
  assert.ok(fetched > 0 && fetched < CHUNK * 1.1, `one chunk fetched, got ${fetched}`);
});

test('gzip input, worker counts and spooling do not change the output', async () => {
  const tar = await makeTar(everyTypeEntries(CHUNK));
  const base = await build(tar, { chunkSize: CHUNK, workers: 1 });
  const gz = await build(gzipSync(tar), { chunkSize: CHUNK, workers: 3 });
  const spooled = await build(tar, { chunkSize: CHUNK, spool: true, workers: 2 });
  assert.deepEqual(gz.blob, base.blob);
  assert.deepEqual(spooled.blob, base.blob);
  assert.deepEqual(gz.result, base.result);
  const otherLevel = await build(tar, { chunkSize: CHUNK, level: 1 });
  assert.notEqual(otherLevel.result.digest, base.result.digest);
  // Same entries, but the TOC records different compressed offsets.
  assert.notEqual(otherLevel.result.tocDigest, base.result.tocDigest);
});

test('prioritized files come first with their parents and hardlink targets, then .prefetch.landmark', async () => {
  const tar = await makeTar(everyTypeEntries(CHUNK));
  const { blob, result } = await build(tar, { chunkSize: CHUNK, prioritizedFiles: ['/d/hard', './x/with-xattrs', 'd/big.bin'] });
  const reader = await openEstargz(bufferSource(blob), { tocDigest: result.tocDigest });
  const names = reader.entries.map((e) => e.name);
  assert.deepEqual(names.slice(0, 7), ['d', 'd/small.txt', 'd/hard', 'x', 'x/with-xattrs', 'd/big.bin', '.prefetch.landmark']);
  assert.ok(!names.includes('.no.prefetch.landmark'));
  const landmark = entryOf(reader, '.prefetch.landmark');
  assert.deepEqual(reader.prefetchRange(), { offset: 0, length: itemAt(landmark.chunks, 0).offset });
  await assertMatchesOracle(reader, await readTarOracle(tar));
  await verifyEstargz(bufferSource(blob), { tocDigest: result.tocDigest });
});

test('existing TOC and landmark entries in the input are replaced; duplicates resolve like Go when spooling', async () => {
  const tar = await makeTar([
    { name: 'stargz.index.json', type: 'file', content: Buffer.from('{}') },
    { name: '.prefetch.landmark', type: 'file', content: Buffer.from([0x0f]) },
    { name: 'a', type: 'file', content: Buffer.from('first') },
    { name: 'b', type: 'file', content: Buffer.from('b') },
    { name: './a', type: 'file', content: Buffer.from('second') },
  ]);
  const { blob } = await build(tar, { spool: true });
  const reader = await openEstargz(bufferSource(blob));
  assert.deepEqual(
    reader.entries.map((e) => e.name),
    ['.no.prefetch.landmark', 'b', 'a'],
  );
  assert.equal((await reader.readFile('a')).toString(), 'second');
  await verifyEstargz(bufferSource(blob));
});

test('an empty tar still yields a valid blob with just the landmark', async () => {
  const { blob, result } = await build(Buffer.alloc(1024));
  const reader = await openEstargz(bufferSource(blob), { tocDigest: result.tocDigest });
  assert.deepEqual(
    reader.entries.map((e) => e.name),
    ['.no.prefetch.landmark'],
  );
  await verifyEstargz(bufferSource(blob));
});

test('a large file streams through in bounded memory', async () => {
  // 256 MiB in 1 MiB pieces: holding the file or the blob would grow RSS by hundreds of MiB;
  // the allowance covers two worker isolates and in-flight chunks.
  const size = 256 << 20;
  const piece = Buffer.alloc(1 << 20, 7);
  const header = ustarFileHeader('huge', size);
  async function* tar() {
    yield header;
    for (let i = 0; i < size / piece.length; i++) yield piece;
    yield Buffer.alloc(1024);
  }
  const { buildEstargz } = await import('../../src/estargz/index.js');
  const { Writable, Readable } = await import('node:stream');
  let written = 0;
  const sink = new Writable({ write: (chunk, _e, done) => ((written += chunk.length), done()) });
  const before = process.memoryUsage().rss;
  let peak = before;
  const timer = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 5);
  const result = await buildEstargz(Readable.from(tar()), sink, { level: 1, chunkSize: 1 << 20 });
  clearInterval(timer);
  assert.equal(result.size, written);
  // landmark (header + padded byte), the file's header and data, then the TOC member's tar.
  assert.ok(result.uncompressedSize > 1024 + 512 + size + 512 + 1024);
  assert.ok(peak - before < 128 << 20, `RSS grew by ${((peak - before) / 2 ** 20).toFixed(1)} MiB`);
});
