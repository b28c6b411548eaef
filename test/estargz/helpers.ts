/* Shared fixtures for the eStargz tests: generated layers, an independent tar oracle (tar-stream),
   blob surgery for bad-input cases, and the Go reference harness. */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { PassThrough, Readable } from 'node:stream';
import { promisify } from 'node:util';
import { gunzipSync, gzipSync } from 'node:zlib';
import tarStream from 'tar-stream';
import {
  buildEstargz,
  encodeFooter,
  parseAnyFooter,
  type BuildOptions,
  type BuildResult,
  type EstargzEntry,
  type EstargzReader,
} from '../../src/estargz/index.js';
import { END_OF_ARCHIVE, paddingFor, ustarFileHeader } from '../../src/estargz/tar.js';
import { collect, type TarEntry } from '../fixtures/tar.js';

export const execFileP = promisify(execFile);

export const HARNESS = resolve(import.meta.dirname, '../../test-tools/estargz-conformance/bin/estargz-conformance');
/** Conformance tests skip, with this reason, only when the Go harness has not been built. */
export const harnessSkip = existsSync(HARNESS) ? false : `Go harness missing at ${HARNESS}; run scripts/build-test-tools.sh`;

export async function harness(args: string[]): Promise<string> {
  const { stdout } = await execFileP(HARNESS, args, { maxBuffer: 64 << 20 });
  return stdout;
}

/** Deterministic pseudo-random bytes (a sha256 counter stream), so fixtures are reproducible. */
export function seededBytes(seed: string, length: number): Buffer {
  const out = Buffer.alloc(length);
  for (let i = 0, block = 0; i < length; block++) {
    const digest = createHash('sha256').update(`${seed}:${block}`).digest();
    i += digest.copy(out, i);
  }
  return out;
}

/** A layer with every entry type the TOC can describe, long names, xattrs and odd characters. */
export function everyTypeEntries(chunkSize: number): TarEntry[] {
  const longDir = `long/${'d'.repeat(90)}/${'e'.repeat(60)}`;
  return [
    { name: 'd/', type: 'directory', mode: 0o755, uid: 1000, gid: 1000, uname: 'alice', gname: 'staff' },
    { name: 'd/empty', type: 'file', mode: 0o644, uid: 1000, gid: 1000, uname: 'alice', gname: 'staff', content: Buffer.alloc(0) },
    {
      name: 'd/small.txt',
      type: 'file',
      mode: 0o640,
      uid: 1000,
      gid: 1000,
      uname: 'alice',
      gname: 'staff',
      content: Buffer.from('hello estargz\n'),
    },
    { name: 'd/big.bin', type: 'file', mode: 0o600, content: seededBytes('big', 5 * chunkSize + 12345) },
    { name: 'd/exact.bin', type: 'file', mode: 0o600, content: seededBytes('exact', 2 * chunkSize) },
    { name: 'd/link', type: 'symlink', linkname: 'small.txt', mode: 0o777 },
    { name: 'd/hard', type: 'link', linkname: 'd/small.txt', mode: 0o640 },
    { name: 'dev/', type: 'directory', mode: 0o755 },
    { name: 'dev/null', type: 'character-device', devmajor: 1, devminor: 3, mode: 0o666 },
    { name: 'dev/sda', type: 'block-device', devmajor: 8, devminor: 0, mode: 0o660 },
    { name: 'd/fifo', type: 'fifo', mode: 0o644 },
    { name: 'd/setuid', type: 'file', mode: 0o4755, content: Buffer.from('#!/bin/sh\n') },
    { name: 'x/', type: 'directory', mode: 0o755, pax: { 'SCHILY.xattr.user.dir': 'on-a-dir' } },
    {
      name: 'x/with-xattrs',
      type: 'file',
      mode: 0o644,
      content: Buffer.from('xattrs here'),
      pax: { 'SCHILY.xattr.user.comment': 'a <b> & c', 'SCHILY.xattr.security.selinux': 'system_u:object_r:bin_t:s0' },
    },
    { name: `${longDir}/`, type: 'directory', mode: 0o755 },
    { name: `${longDir}/${'f'.repeat(120)}.txt`, type: 'file', mode: 0o644, content: seededBytes('long', 3000) },
    { name: `${longDir}/sym`, type: 'symlink', linkname: `../${'t'.repeat(150)}`, mode: 0o777 },
    { name: 'u/ünïcödé <&> "q".txt', type: 'file', mode: 0o644, content: Buffer.from('unicode name') },
    { name: 'u/big-ids', type: 'file', mode: 0o644, uid: 70000, gid: 70001, uname: 'bob', gname: 'bobs', content: Buffer.from('ids') },
  ];
}

/** What an independent tar reader (tar-stream) sees in a tar: the oracle for round trips. */
export interface OracleEntry {
  name: string;
  type: string;
  size: number;
  linkName: string;
  mode: number;
  uid: number;
  gid: number;
  devMajor: number;
  devMinor: number;
  xattrs: Record<string, string>;
  sha256?: string;
  content?: Buffer;
}

export function cleanName(name: string): string {
  return name
    .replace(/^(\.\/)+/, '')
    .replace(/^\/+/, '')
    .replace(/\/+$/, '');
}

const ORACLE_TYPES: Record<string, string> = {
  file: 'reg',
  link: 'hardlink',
  symlink: 'symlink',
  'character-device': 'char',
  'block-device': 'block',
  directory: 'dir',
  fifo: 'fifo',
};

export async function readTarOracle(tar: Buffer): Promise<Map<string, OracleEntry>> {
  const extract = tarStream.extract();
  Readable.from([tar]).pipe(extract);
  const out = new Map<string, OracleEntry>();
  for await (const entry of extract) {
    const h = entry.header;
    const content = await collect(entry);
    const xattrs: Record<string, string> = {};
    for (const [k, v] of Object.entries(h.pax ?? {})) {
      if (k.startsWith('SCHILY.xattr.') && typeof v === 'string') xattrs[k.slice(13)] = v;
    }
    const type = ORACLE_TYPES[h.type ?? 'file'] ?? String(h.type);
    out.set(cleanName(h.name), {
      name: cleanName(h.name),
      type,
      size: type === 'reg' ? content.length : 0,
      linkName: h.linkname ?? '',
      mode: h.mode ?? 0,
      uid: h.uid ?? 0,
      gid: h.gid ?? 0,
      devMajor: h.devmajor ?? 0,
      devMinor: h.devminor ?? 0,
      xattrs,
      ...(type === 'reg' ? { sha256: sha256hex(content), content } : {}),
    });
  }
  return out;
}

export function sha256hex(data: Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}

/** Runs the Starling writer over an in-memory tar and returns the blob. */
export async function build(tar: Buffer, options: BuildOptions = {}): Promise<{ blob: Buffer; result: BuildResult }> {
  const output = new PassThrough();
  const blobPromise = collect(output);
  blobPromise.catch(() => undefined); // the writer destroys the output on failure; its error is reported by buildEstargz
  const result = await buildEstargz(Readable.from([tar]), output, { level: 6, ...options });
  return { blob: await blobPromise, result };
}

/**
 * Replaces a blob's TOC: `edit` gets the parsed JSON (or returns raw text) and the blob gets a new
 * TOC member and footer. Returns the new blob and the new TOC's digest.
 */
export function rewriteToc(blob: Buffer, edit: (toc: any) => any): { blob: Buffer; tocDigest: string } {
  const { tocOffset, size } = parseAnyFooter(blob.subarray(blob.length - 51));
  const tar = gunzipSync(blob.subarray(tocOffset, blob.length - size));
  const jsonSize = Number.parseInt(tar.toString('latin1', 124, 135), 8);
  const toc = JSON.parse(tar.toString('utf8', 512, 512 + jsonSize));
  const edited = edit(toc);
  const json = Buffer.from(typeof edited === 'string' ? edited : JSON.stringify(edited, null, '\t'));
  const member = gzipSync(
    Buffer.concat([ustarFileHeader('stargz.index.json', json.length), json, Buffer.alloc(paddingFor(json.length)), END_OF_ARCHIVE]),
  );
  return {
    blob: Buffer.concat([blob.subarray(0, tocOffset), member, encodeFooter(tocOffset)]),
    tocDigest: `sha256:${sha256hex(json)}`,
  };
}

/** The entry `name` of a layer the test built; an assertion names it if the TOC lacks it. */
export function entryOf(reader: EstargzReader, name: string): EstargzEntry {
  const entry = reader.lookup(name);
  assert.ok(entry, `no entry ${name} in the TOC`);
  return entry;
}

export async function withTempDir<T>(use: (dir: string) => Promise<T>): Promise<T> {
  const dir = await mkdtemp(join(tmpdir(), 'starling-estargz-test-'));
  try {
    return await use(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** A deterministic PRNG for the fuzz test: the benchmarks' and the simulator's. */
export { seededRandom as prng } from '../../bench/lib/random.js';
