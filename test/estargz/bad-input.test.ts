import assert from 'node:assert/strict';
import { test } from 'node:test';
import { gzipSync } from 'node:zlib';
import { bufferSource, encodeFooter, EstargzError, openEstargz, verifyEstargz, type EstargzErrorCode } from '../../src/estargz/index.js';
import { ustarFileHeader } from '../../src/estargz/tar.js';
import { build, entryOf, everyTypeEntries, rewriteToc } from './helpers.js';
import { makeTar } from '../fixtures/tar.js';
import { itemAt } from '../../src/common/indexing.js';

const CHUNK = 64 * 1024;
const isError = (code: EstargzErrorCode, message: RegExp) => (e: unknown) =>
  e instanceof EstargzError && e.code === code && message.test(e.message);

async function goodBlob() {
  return build(await makeTar(everyTypeEntries(CHUNK)), { chunkSize: CHUNK });
}

test('truncated blobs and forged footers', async () => {
  const { blob } = await goodBlob();
  await assert.rejects(openEstargz(bufferSource(blob.subarray(0, 30))), isError('FOOTER', /smaller than a 51-byte footer/));
  await assert.rejects(openEstargz(bufferSource(blob.subarray(0, blob.length - 7))), isError('FOOTER', /no valid eStargz footer/));
  const forged = Buffer.from(blob);
  forged.write('XTARGZ', blob.length - 51 + 32, 'latin1');
  await assert.rejects(openEstargz(bufferSource(forged)), isError('FOOTER', /STARGZ magic/));
});

test('TOC offset out of range or not at the TOC member', async () => {
  const { blob } = await goodBlob();
  const body = blob.subarray(0, blob.length - 51);
  for (const offset of [body.length, body.length + 100, 2 ** 52]) {
    await assert.rejects(openEstargz(bufferSource(Buffer.concat([body, encodeFooter(offset)]))), isError('FOOTER', /out of range/));
  }
  await assert.rejects(
    openEstargz(bufferSource(Buffer.concat([body, encodeFooter(3)]))),
    (e) => e instanceof EstargzError && /TOC member|gzip/.test(e.message),
  );
});

test('TOC digest mismatch', async () => {
  const { blob } = await goodBlob();
  await assert.rejects(
    openEstargz(bufferSource(blob), { tocDigest: `sha256:${'0'.repeat(64)}` }),
    isError('TOC_DIGEST', /TOC digest mismatch/),
  );
  await assert.rejects(verifyEstargz(bufferSource(blob), { tocDigest: `sha256:${'0'.repeat(64)}` }), isError('TOC_DIGEST', /mismatch/));
});

test('oversized TOC is refused before parsing, both compressed and uncompressed', async () => {
  const { blob } = await goodBlob();
  await assert.rejects(openEstargz(bufferSource(blob), { maxTocSize: 1000 }), isError('TOC_TOO_LARGE', /1000/));
  // A highly compressible TOC: small on the wire, over the limit once inflated.
  const padded = rewriteToc(blob, (toc) => JSON.stringify(toc) + ' '.repeat(3 << 20));
  await assert.rejects(openEstargz(bufferSource(padded.blob), { maxTocSize: 2 << 20 }), isError('TOC_TOO_LARGE', /limit|more than/));
  await openEstargz(bufferSource(padded.blob), { tocDigest: padded.tocDigest }); // fine under the default cap
});

test('TOC member with the wrong entry name or no tar inside', async () => {
  const { blob } = await goodBlob();
  const tocOffset = (await openEstargz(bufferSource(blob))).tocOffset;
  const wrongName = gzipSync(Buffer.concat([ustarFileHeader('other.json', 2), Buffer.from('{}'), Buffer.alloc(510 + 1024)]));
  await assert.rejects(
    openEstargz(bufferSource(Buffer.concat([blob.subarray(0, tocOffset), wrongName, encodeFooter(tocOffset)]))),
    isError('TOC', /named "other.json"/),
  );
  const notTar = gzipSync(Buffer.alloc(1024, 0x41));
  await assert.rejects(
    openEstargz(bufferSource(Buffer.concat([blob.subarray(0, tocOffset), notTar, encodeFooter(tocOffset)]))),
    isError('TAR', /checksum/),
  );
});

test('unsafe and duplicate names in a TOC', async () => {
  const { blob } = await goodBlob();
  const rename = (from: string, to: string) =>
    rewriteToc(blob, (toc) => ((toc.entries.find((e: { name: string }) => e.name === from).name = to), toc)).blob;
  await assert.rejects(openEstargz(bufferSource(rename('d/small.txt', '../../etc/passwd'))), isError('UNSAFE_NAME', /contains "\.\."/));
  await assert.rejects(openEstargz(bufferSource(rename('d/small.txt', '/etc/passwd'))), isError('UNSAFE_NAME', /absolute/));
  await assert.rejects(openEstargz(bufferSource(rename('d/small.txt', 'd/setuid'))), isError('DUPLICATE', /duplicate entry "d\/setuid"/));
});

test('chunk digest mismatch: lazy reads and the verifier both refuse the data', async () => {
  const { blob } = await goodBlob();
  // Point the TOC's digest for one chunk at the wrong value: the data itself is intact gzip.
  const wrongDigest = rewriteToc(blob, (toc) => {
    const chunk = toc.entries.filter((e: { name: string }) => e.name === 'd/big.bin')[2];
    chunk.chunkDigest = `sha256:${'1'.repeat(64)}`;
    return toc;
  });
  const reader = await openEstargz(bufferSource(wrongDigest.blob));
  await reader.readRange('d/big.bin', 0, 10); // other chunks are fine
  await assert.rejects(reader.readRange('d/big.bin', 2 * CHUNK + 1, 10), isError('CHUNK_DIGEST', /"d\/big.bin".*does not match/));
  await assert.rejects(reader.readFile('d/big.bin'), isError('CHUNK_DIGEST', /does not match/));
  await assert.rejects(verifyEstargz(bufferSource(wrongDigest.blob)), isError('CHUNK_DIGEST', /does not match/));
});

test('corrupted compressed data is a clear gzip or digest error', async () => {
  const { blob } = await goodBlob();
  const reader = await openEstargz(bufferSource(blob));
  const chunk = itemAt(entryOf(reader, 'd/big.bin').chunks, 1);
  const corrupt = Buffer.from(blob);
  for (let i = chunk.offset + 20; i < chunk.offset + 60; i++) corrupt[i] = corrupt.readUInt8(i) ^ 0x5a;
  const bad = await openEstargz(bufferSource(corrupt));
  await assert.rejects(
    bad.readRange('d/big.bin', CHUNK, 1),
    (e) => e instanceof EstargzError && ['GZIP', 'CHUNK_DIGEST', 'CHUNK'].includes(e.code),
  );
  await assert.rejects(verifyEstargz(bufferSource(corrupt)), EstargzError);
});

test('the verifier catches TOC offsets that do not start the chunk member and TOC/tar disagreements', async () => {
  const { blob } = await goodBlob();
  const swapped = rewriteToc(blob, (toc) => {
    const [a, b] = toc.entries.filter((e: { type: string; size?: number }) => e.type === 'reg' && (e.size ?? 0) > 0);
    [a.offset, b.offset] = [b.offset, a.offset];
    return toc;
  });
  await assert.rejects(
    verifyEstargz(bufferSource(swapped.blob)),
    (e) => e instanceof EstargzError && ['MISMATCH', 'CHUNK_DIGEST'].includes(e.code),
  );
  const modeChanged = rewriteToc(blob, (toc) => ((toc.entries.find((e: { name: string }) => e.name === 'd/fifo').mode = 0o600), toc));
  await openEstargz(bufferSource(modeChanged.blob)); // the TOC alone is consistent...
  await assert.rejects(
    verifyEstargz(bufferSource(modeChanged.blob)),
    isError('MISMATCH', /"d\/fifo".*mode is 420 in the tar but 384 in the TOC/),
  );
  const dropped = rewriteToc(blob, (toc) => ((toc.entries = toc.entries.filter((e: { name: string }) => e.name !== 'd/fifo')), toc));
  await assert.rejects(verifyEstargz(bufferSource(dropped.blob)), isError('MISMATCH', /name is "d\/fifo" in the tar/));
});

test('the writer refuses unsafe, duplicate (unless spooling), unsupported and truncated input', async () => {
  const tarOf = (name: string) => makeTar([{ name, type: 'file', content: Buffer.from('x') }]);
  await assert.rejects(build(await tarOf('../escape')), isError('UNSAFE_NAME', /contains "\.\."/));
  await assert.rejects(build(await tarOf('/abs')), isError('UNSAFE_NAME', /absolute/));
  const dup = await makeTar([
    { name: 'a', type: 'file', content: Buffer.from('1') },
    { name: 'a', type: 'file', content: Buffer.from('2') },
  ]);
  await assert.rejects(build(dup), isError('DUPLICATE', /more than once.*--spool/));
  await build(dup, { spool: true });
  const contiguous = Buffer.from(await tarOf('c'));
  contiguous[156] = 0x37; // '7' contiguous file: Go's writer refuses it too
  fixChecksum(contiguous);
  await assert.rejects(build(contiguous), isError('UNSUPPORTED', /type '7'/));
  const tar = await makeTar([{ name: 'big', type: 'file', content: Buffer.alloc(5000, 1) }]);
  await assert.rejects(build(tar.subarray(0, 3000)), isError('TAR', /ends inside "big"|unexpected end/));
  await assert.rejects(build(Buffer.from('this is not a tar archive'.repeat(40))), isError('TAR', /checksum/));
  await assert.rejects(build(gzipSync(tar).subarray(0, 100)), isError('INPUT', /gzip/));
  await assert.rejects(build(tar, { prioritizedFiles: ['nope'] }), isError('NOT_FOUND', /"nope" is not in the layer/));
  await assert.rejects(build(tar, { level: 11 }), isError('INPUT', /gzip level 11/));
});

function fixChecksum(block: Buffer): void {
  block.fill(0x20, 148, 156);
  let sum = 0;
  for (const byte of block.subarray(0, 512)) sum += byte;
  block.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 'latin1');
}
