/* Seeded fuzzing: mutated footers, TOCs, compressed data and tar headers must only ever produce
   EstargzError (clear, coded errors) or a correct result: never another exception, never a hang. */
import assert from 'node:assert/strict';
import { Readable } from 'node:stream';
import { test } from 'node:test';
import { bufferSource, EstargzError, openEstargz, verifyEstargz } from '../../src/estargz/index.js';
import { streamedEntries } from '../../src/estargz/entries.js';
import { build, prng, rewriteToc, seededBytes } from './helpers.js';
import { makeTar } from '../fixtures/tar.js';
import { itemAt } from '../../src/common/indexing.js';

const CHUNK = 1024;
/**
 * CI runs a few thousand cases with a fixed seed. A longer hunt, kept out of CI:
 *   STARLING_FUZZ_SCALE=100 STARLING_FUZZ_SEED=$RANDOM node --import tsx --test test/estargz/fuzz.test.ts
 */
const SEED = Number(process.env.STARLING_FUZZ_SEED ?? 0x5eed);
const SCALE = Math.max(1, Number(process.env.STARLING_FUZZ_SCALE ?? 1));
const scaled = (n: number) => n * SCALE;

async function fixture() {
  const tar = await makeTar([
    { name: 'a/', type: 'directory', mode: 0o755 },
    { name: 'a/one', type: 'file', content: seededBytes('one', 3 * CHUNK + 100), pax: { 'SCHILY.xattr.user.k': 'v' } },
    { name: 'a/two', type: 'file', content: Buffer.from('two') },
    { name: 'a/hard', type: 'link', linkname: 'a/two' },
    { name: 'a/sym', type: 'symlink', linkname: 'one' },
    { name: `a/${'l'.repeat(150)}`, type: 'file', content: Buffer.from('long') },
  ]);
  return { tar, ...(await build(tar, { chunkSize: CHUNK, workers: 1 })) };
}

/** Runs everything a consumer might do with a blob; only EstargzError may escape. */
async function exercise(blob: Buffer, label: string): Promise<void> {
  try {
    const reader = await openEstargz(bufferSource(blob));
    for (const entry of reader.entries) {
      if (entry.type === 'reg' || entry.type === 'hardlink') await reader.readFile(entry.name).catch(rethrowUnlessEstargz(label));
    }
    await verifyEstargz(bufferSource(blob));
  } catch (error) {
    rethrowUnlessEstargz(label)(error);
  }
}

function rethrowUnlessEstargz(label: string) {
  return (error: unknown) => {
    if (error instanceof EstargzError && error.message.length > 0) return;
    assert.fail(`${label}: expected an EstargzError, got ${error instanceof Error ? `${error.name}: ${error.stack}` : String(error)}`);
  };
}

const WEIRD_VALUES: unknown[] = [
  -1,
  0,
  1,
  1.5,
  2 ** 53,
  1e300,
  '',
  'x',
  '../x',
  '/abs',
  null,
  {},
  [],
  true,
  'sha256:zz',
  `sha256:${'a'.repeat(64)}`,
];

test('fuzz: footers, TOC JSON, compressed data', { timeout: 60_000 * SCALE }, async () => {
  const random = prng(SEED);
  const pick = <T>(items: readonly T[]): T => itemAt(items, Math.floor(random() * items.length));
  const { blob } = await fixture();
  let cases = 0;

  for (let i = 0; i < scaled(800); i++, cases++) {
    const mutated = Buffer.from(blob);
    const flips = 1 + Math.floor(random() * 3);
    for (let f = 0; f < flips; f++) mutated[mutated.length - 1 - Math.floor(random() * 51)] = Math.floor(random() * 256);
    await exercise(mutated, `footer case ${i}`);
  }

  for (let i = 0; i < scaled(900); i++, cases++) {
    const mutated = rewriteToc(blob, (toc) => {
      if (random() < 0.3) {
        // Byte-level damage to the JSON text.
        const text = Buffer.from(JSON.stringify(toc));
        for (let f = 0; f < 1 + random() * 4; f++) text[Math.floor(random() * text.length)] = Math.floor(random() * 128);
        return text.toString('latin1');
      }
      const entry = pick(toc.entries as Record<string, unknown>[]);
      const field = pick([
        'name',
        'type',
        'size',
        'offset',
        'chunkOffset',
        'chunkSize',
        'chunkDigest',
        'digest',
        'linkName',
        'xattrs',
        'mode',
        'innerOffset',
      ]);
      entry[field] = random() < 0.5 ? pick(WEIRD_VALUES) : pick(toc.entries as Record<string, unknown>[])[field];
      if (random() < 0.2) toc.entries.splice(Math.floor(random() * toc.entries.length), 1);
      if (random() < 0.1) toc.entries.push(structuredClone(pick(toc.entries)));
      return toc;
    });
    await exercise(mutated.blob, `TOC case ${i}`);
  }

  const tocOffset = (await openEstargz(bufferSource(blob))).tocOffset;
  for (let i = 0; i < scaled(200); i++, cases++) {
    const mutated = Buffer.from(blob);
    const at = Math.floor(random() * tocOffset);
    mutated.writeUInt8(mutated.readUInt8(at) ^ (1 + Math.floor(random() * 255)), at);
    await exercise(mutated, `data case ${i}`);
  }
  assert.equal(cases, 1900);
});

test('fuzz: tar headers fed to the writer', { timeout: 60_000 * SCALE }, async () => {
  const random = prng(SEED + 1);
  const { tar } = await fixture();
  const headerOffsets: number[] = [];
  for (let at = 0; at + 512 <= tar.length; at += 512) if (tar.toString('latin1', at + 257, at + 262) === 'ustar') headerOffsets.push(at);

  const mutate = (fixChecksum: boolean) => {
    const mutated = Buffer.from(tar);
    const at = itemAt(headerOffsets, Math.floor(random() * headerOffsets.length));
    for (let f = 0; f < 1 + random() * 3; f++) mutated[at + Math.floor(random() * 512)] = Math.floor(random() * 256);
    if (fixChecksum) {
      // Keep the checksum valid so the mutation reaches the field parsers.
      mutated.fill(0x20, at + 148, at + 156);
      let sum = 0;
      for (const byte of mutated.subarray(at, at + 512)) sum += byte;
      mutated.write(`${sum.toString(8).padStart(6, '0')}\0 `, at + 148, 'latin1');
    }
    return mutated;
  };

  // The parser alone, fast: every entry and its data read through.
  for (let i = 0; i < scaled(2000); i++) {
    const mutated = mutate(random() < 0.8);
    try {
      for await (const entry of streamedEntries(Readable.from([mutated]))) for await (const piece of entry.data) void piece;
    } catch (error) {
      rethrowUnlessEstargz(`tar case ${i}`)(error);
    }
  }
  // Whole builds (a worker pool each), fewer: the result must be readable or the error clear.
  for (let i = 0; i < scaled(40); i++) {
    const mutated = mutate(true);
    try {
      const { blob } = await build(mutated, { chunkSize: CHUNK, workers: 1 });
      await verifyEstargz(bufferSource(blob));
    } catch (error) {
      rethrowUnlessEstargz(`build case ${i}`)(error);
    }
  }
});
