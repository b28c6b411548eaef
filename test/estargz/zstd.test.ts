/* zstd:chunked layers (stargz-snapshotter v0.12 estargz/zstdchunked), both ways against the Go reference, and zstd input. */
import assert from 'node:assert/strict';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { test } from 'node:test';
import { createRequire } from 'node:module';
import { bufferSource, openEstargz, serializeToc, verifyEstargz, EstargzError } from '../../src/estargz/index.js';
import { build, entryOf, everyTypeEntries, harness, harnessSkip, readTarOracle, sha256hex, withTempDir } from './helpers.js';
import { makeTar } from '../fixtures/tar.js';
import { itemAt } from '../../src/common/indexing.js';

const zstd = createRequire(import.meta.url)('zstd-napi') as typeof import('zstd-napi');
const CHUNK = 64 * 1024;
const PRIORITIZED = ['d/hard', 'x/with-xattrs', 'd/big.bin'];

test('Starling zstd:chunked blobs have the Go layout and read back', async () => {
  const tar = await makeTar(everyTypeEntries(CHUNK));
  const { blob, result } = await build(tar, { chunkSize: CHUNK, compression: 'zstd', level: 3, prioritizedFiles: PRIORITIZED });
  // The last 48 bytes: a skippable frame (magic 0x184D2A50, length 40) holding the footer.
  const tail = blob.subarray(blob.length - 48);
  assert.deepEqual([...tail.subarray(0, 8)], [0x50, 0x2a, 0x4d, 0x18, 40, 0, 0, 0]);
  assert.equal(tail.toString('latin1', 40), 'GnUlInUx');
  const tocOffset = Number(tail.readBigUInt64LE(8));
  const compressedLength = Number(tail.readBigUInt64LE(16));
  assert.equal(tocOffset + compressedLength, blob.length - 48);
  assert.equal(result.zstdManifest?.position, `${tocOffset}:${compressedLength}:${Number(tail.readBigUInt64LE(24))}:1`);
  assert.equal(result.zstdManifest?.checksum, `sha256:${sha256hex(blob.subarray(tocOffset, tocOffset + compressedLength))}`);
  assert.equal(`sha256:${sha256hex(zstd.decompress(blob.subarray(tocOffset, tocOffset + compressedLength)))}`, result.tocDigest);
  // A plain zstd decoder sees the tar stream (skippable frames are skipped): that is the diffID.
  const plain = zstd.decompress(blob);
  assert.equal(`sha256:${sha256hex(plain)}`, result.diffID);
  assert.equal(plain.length, result.uncompressedSize);

  const reader = await openEstargz(bufferSource(blob), { tocDigest: result.tocDigest });
  assert.equal(reader.format, 'zstd');
  for (const expected of (await readTarOracle(tar)).values()) {
    if (expected.type === 'reg') assert.equal(sha256hex(await reader.readFile(expected.name)), expected.sha256, expected.name);
  }
  const names = reader.entries.map((e) => e.name);
  for (const path of PRIORITIZED) assert.ok(names.indexOf(path) < names.indexOf('.prefetch.landmark'), path);
  assert.ok((reader.prefetchRange()?.length ?? 0) > 0);
  const verified = await verifyEstargz(bufferSource(blob), { tocDigest: result.tocDigest });
  assert.equal(verified.diffID, result.diffID);
});

test('zstd:chunked bad input: corrupt chunk, broken footer and trailer are named', async () => {
  const tar = await makeTar(everyTypeEntries(CHUNK));
  const { blob, result } = await build(tar, { chunkSize: CHUNK, compression: 'zstd' });
  const reader = await openEstargz(bufferSource(blob));
  const chunk = itemAt(entryOf(reader, 'd/big.bin').chunks, 2);
  const damaged = Buffer.from(blob);
  damaged[chunk.offset + 20] = damaged.readUInt8(chunk.offset + 20) ^ 0xff;
  await assert.rejects(
    verifyEstargz(bufferSource(damaged)),
    (e: EstargzError) => e instanceof EstargzError && /zstd|digest/.test(e.message),
  );
  const badType = Buffer.from(blob);
  badType.writeBigUInt64LE(7n, badType.length - 16);
  await assert.rejects(openEstargz(bufferSource(badType)), /manifest type 7 is not supported/);
  const badOffset = Buffer.from(blob);
  badOffset.writeBigUInt64LE(BigInt(blob.length), badOffset.length - 40);
  await assert.rejects(openEstargz(bufferSource(badOffset)), /runs past the footer frame/);
  const badFrame = Buffer.from(blob);
  badFrame[reader.payloadEnd] = 0; // the TOC's skippable frame magic
  await assert.rejects(verifyEstargz(bufferSource(badFrame), { tocDigest: result.tocDigest }), /no skippable frame/);
});

test('zstd input tars convert like plain tars', async () => {
  const tar = await makeTar(everyTypeEntries(CHUNK));
  const fromTar = await build(tar, { chunkSize: CHUNK });
  const fromZstd = await build(zstd.compress(tar, { compressionLevel: 3 }), { chunkSize: CHUNK });
  assert.equal(fromZstd.result.tocDigest, fromTar.result.tocDigest);
  assert.equal(fromZstd.result.digest, fromTar.result.digest);
  await assert.rejects(build(Buffer.concat([zstd.compress(tar).subarray(0, 200)]), {}), /not a valid zstd stream/);
});

test('Starling zstd:chunked blobs pass Go estargz.Open(zstdchunked) + VerifyTOC, file by file', { skip: harnessSkip }, async () => {
  await withTempDir(async (dir) => {
    const tar = await makeTar(everyTypeEntries(CHUNK));
    const oracle = await readTarOracle(tar);
    for (const prioritizedFiles of [[], PRIORITIZED]) {
      const { blob, result } = await build(tar, { chunkSize: CHUNK, compression: 'zstd', prioritizedFiles });
      await writeFile(join(dir, 'z.blob'), blob);
      const out = await harness(['verify-and-dump', '-blob', join(dir, 'z.blob'), '-toc-digest', result.tocDigest]);
      const dump = new Map(
        out
          .trim()
          .split('\n')
          .map((line) => JSON.parse(line))
          .map((e) => [e.name, e]),
      );
      for (const expected of oracle.values()) {
        if (expected.type !== 'reg') continue;
        assert.equal(dump.get(expected.name)?.sha256, expected.sha256, expected.name);
        assert.equal(dump.get(expected.name)?.chunks ?? 0, Math.ceil(expected.size / CHUNK), expected.name);
      }
      assert.ok(dump.has(prioritizedFiles.length ? '.prefetch.landmark' : '.no.prefetch.landmark'));
      await assert.rejects(harness(['verify-and-dump', '-blob', join(dir, 'z.blob'), '-toc-digest', `sha256:${'0'.repeat(64)}`]));
    }
  });
});

test('Go-built zstd:chunked blobs are read and verified by Starling against the tar', { skip: harnessSkip }, async () => {
  await withTempDir(async (dir) => {
    const tar = await makeTar(everyTypeEntries(CHUNK));
    await writeFile(join(dir, 'in.tar'), tar);
    await writeFile(join(dir, 'prio.txt'), PRIORITIZED.join('\n'));
    const go = JSON.parse(
      await harness([
        'build',
        '-zstd',
        '-in',
        join(dir, 'in.tar'),
        '-out',
        join(dir, 'go.zst'),
        '-chunk-size',
        String(CHUNK),
        '-level',
        '2',
        '-prioritized',
        join(dir, 'prio.txt'),
      ]),
    );
    const blob = await readFile(join(dir, 'go.zst'));
    const reader = await openEstargz(bufferSource(blob), { tocDigest: go.tocDigest });
    assert.equal(reader.format, 'zstd');
    for (const expected of (await readTarOracle(tar)).values()) {
      const entry = reader.lookup(expected.name);
      assert.ok(entry, expected.name);
      if (expected.type === 'reg') assert.equal(sha256hex(await reader.readFile(expected.name)), expected.sha256, expected.name);
    }
    assert.ok(reader.prefetchRange());
    const verified = await verifyEstargz(bufferSource(blob), { tocDigest: go.tocDigest });
    assert.equal(verified.diffID, go.diffID);
    // Same annotation formats as Go's converter; Go's TOC JSON re-serialized by Starling is identical.
    const ours = await build(tar, { chunkSize: CHUNK, compression: 'zstd', prioritizedFiles: PRIORITIZED });
    assert.match(go.manifestPosition, new RegExp(`^${reader.tocOffset}:\\d+:\\d+:1$`));
    assert.match(ours.result.zstdManifest?.position ?? '', /^\d+:\d+:\d+:1$/);
    assert.equal(
      go.manifestChecksum,
      `sha256:${sha256hex(blob.subarray(reader.tocOffset, reader.tocOffset + Number(go.manifestPosition.split(':')[1])))}`,
    );
    const goJson = zstd.decompress(blob.subarray(reader.tocOffset, reader.tocOffset + Number(go.manifestPosition.split(':')[1])));
    assert.equal(serializeToc(reader.toc).toString(), goJson.toString());
  });
});
