/* Compatibility with the Go reference (stargz-snapshotter v0.12 estargz, via test-tools/estargz-conformance). */
import assert from 'node:assert/strict';
import { mkdir, readFile, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { test } from 'node:test';
import { gunzipSync } from 'node:zlib';
import { bufferSource, encodeFooter, openEstargz, serializeToc, verifyEstargz, type EstargzReader } from '../../src/estargz/index.js';
import {
  build,
  cleanName,
  everyTypeEntries,
  execFileP,
  harness,
  harnessSkip,
  readTarOracle,
  sha256hex,
  withTempDir,
  type OracleEntry,
} from './helpers.js';
import { makeTar } from '../fixtures/tar.js';

const CHUNK = 64 * 1024;
const PRIORITIZED = ['d/hard', 'x/with-xattrs', 'd/big.bin'];

interface GoDumpEntry {
  name: string;
  type: string;
  size: number;
  linkName?: string;
  mode: number;
  uid: number;
  gid: number;
  devMajor?: number;
  devMinor?: number;
  xattrs?: Record<string, string>;
  sha256?: string;
  chunks?: number;
}

/** Layers to test with: tar-stream's ustar/PAX output, and GNU tar's own format (long-name 'L'/'K' headers). */
async function fixtures(dir: string): Promise<{ label: string; tar: Buffer }[]> {
  const root = join(dir, 'gnu-src');
  const deep = join(root, 'g', 'x'.repeat(120), 'y'.repeat(110));
  await mkdir(deep, { recursive: true });
  await writeFile(join(deep, `${'z'.repeat(140)}.dat`), Buffer.alloc(3 * CHUNK + 17, 'q'));
  await writeFile(join(root, 'g', 'small'), 'small file');
  await symlink(`../${'t'.repeat(130)}/target`, join(root, 'g', 'longlink'));
  await execFileP('tar', [
    '--format=gnu',
    '--owner=0',
    '--group=0',
    '--mtime=2021-01-02 03:04:05Z',
    '-C',
    root,
    '-cf',
    join(dir, 'gnu.tar'),
    'g',
  ]);
  return [
    { label: 'ustar/PAX (every entry type)', tar: await makeTar(everyTypeEntries(CHUNK)) },
    { label: 'GNU tar format', tar: await readFile(join(dir, 'gnu.tar')) },
  ];
}

/** Go's reader output (after its own VerifyTOC and per-chunk verification) must match the original tar. */
function assertGoDumpMatches(dump: GoDumpEntry[], oracle: Map<string, OracleEntry>, landmark: string): void {
  const byName = new Map(dump.map((e) => [e.name, e]));
  for (const expected of oracle.values()) {
    const got = byName.get(expected.name);
    assert.ok(got, `Go reader misses ${expected.name}`);
    if (expected.type === 'hardlink') {
      // Go resolves hardlinks to the entry holding the data.
      assert.equal(got.sha256, oracle.get(cleanName(expected.linkName))?.sha256, expected.name);
      continue;
    }
    assert.equal(got.type, expected.type, expected.name);
    assert.equal(got.size, expected.size, expected.name);
    assert.equal(got.mode, expected.mode, expected.name);
    assert.deepEqual([got.uid, got.gid], [expected.uid, expected.gid], expected.name);
    assert.equal(got.linkName ?? '', expected.type === 'symlink' ? expected.linkName : '', expected.name);
    assert.deepEqual([got.devMajor ?? 0, got.devMinor ?? 0], [expected.devMajor, expected.devMinor], expected.name);
    assert.deepEqual(got.xattrs ?? {}, expected.xattrs, expected.name);
    if (expected.type === 'reg') {
      assert.equal(got.sha256, expected.sha256, expected.name);
      assert.equal(got.chunks ?? 0, Math.ceil(expected.size / CHUNK), expected.name);
    }
  }
  assert.equal(byName.get(landmark)?.sha256, sha256hex(Buffer.from([0x0f])));
  // Anything else Go shows must be a directory it created implicitly for a parent path.
  for (const entry of dump) {
    if (!oracle.has(entry.name) && entry.name !== landmark) assert.equal(entry.type, 'dir', `unexpected ${entry.name}`);
  }
}

async function assertStarlingReadsOracle(reader: EstargzReader, oracle: Map<string, OracleEntry>): Promise<void> {
  for (const expected of oracle.values()) {
    const entry = reader.lookup(expected.name);
    assert.ok(entry, `Starling misses ${expected.name}`);
    assert.equal(entry.type, expected.type, expected.name);
    assert.equal(entry.mode, expected.mode, expected.name);
    if (expected.type === 'reg') assert.equal(sha256hex(await reader.readFile(expected.name)), expected.sha256, expected.name);
    if (expected.type === 'symlink' || expected.type === 'hardlink') assert.equal(entry.linkName, expected.linkName);
  }
}

/** The TOC as a reader sees it, minus what depends on compression (offsets). */
function semanticToc(reader: EstargzReader) {
  return reader.entries.map(({ chunks, tocName, ...rest }) => ({
    ...rest,
    xattrs: Object.fromEntries(Object.entries(rest.xattrs).map(([k, v]) => [k, v.toString('hex')])),
    chunks: chunks.map(({ chunkOffset, chunkSize, digest }) => ({ chunkOffset, chunkSize, digest })),
    tocName,
  }));
}

test('(a) Starling blobs pass Go estargz.Open + VerifyTOC and read back file by file', { skip: harnessSkip }, async () => {
  await withTempDir(async (dir) => {
    for (const { label, tar } of await fixtures(dir)) {
      const oracle = await readTarOracle(tar);
      for (const prioritized of [[], label.startsWith('ustar') ? PRIORITIZED : ['g/small']]) {
        const { blob, result } = await build(tar, { chunkSize: CHUNK, prioritizedFiles: prioritized });
        const path = join(dir, 'starling.esgz');
        await writeFile(path, blob);
        const out = await harness(['verify-and-dump', '-blob', path, '-toc-digest', result.tocDigest]);
        const dump = out
          .trim()
          .split('\n')
          .map((line) => JSON.parse(line) as GoDumpEntry);
        assertGoDumpMatches(dump, oracle, prioritized.length ? '.prefetch.landmark' : '.no.prefetch.landmark');
      }
      // Go refuses the blob when told a different TOC digest: the check above is not vacuous.
      const { blob } = await build(tar, { chunkSize: CHUNK });
      await writeFile(join(dir, 'x.esgz'), blob);
      await assert.rejects(
        harness(['verify-and-dump', '-blob', join(dir, 'x.esgz'), '-toc-digest', `sha256:${'0'.repeat(64)}`]),
        /invalid TOC JSON/,
        label,
      );
    }
  });
});

test('(b) Go-built blobs (prioritized files, 64 KiB chunks) are read and verified by Starling', { skip: harnessSkip }, async () => {
  await withTempDir(async (dir) => {
    for (const { label, tar } of await fixtures(dir)) {
      const oracle = await readTarOracle(tar);
      const tarPath = join(dir, 'in.tar');
      const listPath = join(dir, 'prioritized.txt');
      await writeFile(tarPath, tar);
      await writeFile(listPath, (label.startsWith('ustar') ? PRIORITIZED : ['g/small']).join('\n'));
      const blobPath = join(dir, 'go.esgz');
      const go = JSON.parse(
        await harness(['build', '-in', tarPath, '-out', blobPath, '-chunk-size', String(CHUNK), '-level', '6', '-prioritized', listPath]),
      );
      const blob = await readFile(blobPath);
      assert.equal(go.size, blob.length);

      const reader = await openEstargz(bufferSource(blob), { tocDigest: go.tocDigest });
      assert.equal(reader.tocDigest, go.tocDigest, label);
      await assertStarlingReadsOracle(reader, oracle);
      assert.ok(reader.prefetchRange(), 'Go wrote a .prefetch.landmark');
      const verified = await verifyEstargz(bufferSource(blob), { tocDigest: go.tocDigest });
      assert.equal(verified.diffID, go.diffID, `${label}: Starling's diffID of a Go blob equals Go's`);

      // Byte-level facts: Go's footer equals ours for the same offset, and Go's TOC JSON
      // re-serialized by Starling is byte-identical (field order, omitempty, escaping, base64).
      assert.deepEqual(blob.subarray(blob.length - 51), encodeFooter(reader.tocOffset));
      const tocTar = gunzipSync(blob.subarray(reader.tocOffset, blob.length - 51));
      const goJson = tocTar.subarray(512, 512 + Number.parseInt(tocTar.toString('latin1', 124, 135), 8));
      assert.equal(serializeToc(reader.toc).toString(), goJson.toString(), label);

      // Same input, same options: Starling's TOC describes exactly what Go's does, apart from offsets.
      const ours = await build(tar, { chunkSize: CHUNK, prioritizedFiles: (await readFile(listPath, 'utf8')).split('\n') });
      const ourReader = await openEstargz(bufferSource(ours.blob));
      assert.deepEqual(semanticToc(ourReader), semanticToc(reader), label);
    }
  });
});

test('(c) single-writer Go blobs (Writer.AppendTar, no landmark) read and verify too', { skip: harnessSkip }, async () => {
  await withTempDir(async (dir) => {
    const tar = await makeTar(everyTypeEntries(CHUNK));
    await writeFile(join(dir, 'in.tar'), tar);
    const go = JSON.parse(
      await harness(['append', '-in', join(dir, 'in.tar'), '-out', join(dir, 'go.esgz'), '-chunk-size', String(CHUNK), '-level', '1']),
    );
    const blob = await readFile(join(dir, 'go.esgz'));
    const reader = await openEstargz(bufferSource(blob), { tocDigest: go.tocDigest });
    await assertStarlingReadsOracle(reader, await readTarOracle(tar));
    assert.equal((await verifyEstargz(bufferSource(blob))).diffID, go.diffID);
  });
});
