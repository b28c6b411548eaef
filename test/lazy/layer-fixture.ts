// A test layer with every kind of entry an eStargz TOC can describe, built into eStargz blobs
// with the project's writer, and a hand-made copy of a blob with one chunk altered.
import { createHash, createCipheriv } from 'node:crypto';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { Readable } from 'node:stream';
import { createWriteStream } from 'node:fs';
import { crc32, gunzipSync } from 'node:zlib';
import { buildEstargz, fileSource, openEstargz, type BuildResult, type EstargzReader } from '../../src/estargz/index.js';
import type { TarEntry } from '../fixtures/tar.js';

export const CHUNK_SIZE = 256 * 1024;

/** Incompressible bytes derived from a seed (AES-CTR keystream). */
export function randomContent(seed: string, size: number): Buffer {
  const key = createHash('sha256').update(seed).digest();
  return createCipheriv('aes-256-ctr', key, Buffer.alloc(16)).update(Buffer.alloc(size));
}

export const PRIORITIZED = ['etc/prio.conf', 'bin/tool'];

export function layerEntries(bigSize: number): TarEntry[] {
  return [
    { name: 'etc/', type: 'directory', mode: 0o755 },
    { name: 'etc/prio.conf', type: 'file', mode: 0o644, content: Buffer.from('prioritized = true\n') },
    { name: 'bin/', type: 'directory', mode: 0o755 },
    { name: 'bin/tool', type: 'file', mode: 0o4755, content: randomContent('tool', 300_000) },
    { name: 'data/', type: 'directory', mode: 0o750, uid: 1000, gid: 1001, uname: 'alice', gname: 'staff' },
    {
      name: 'data/small.txt',
      type: 'file',
      mode: 0o640,
      uid: 1000,
      gid: 1001,
      uname: 'alice',
      gname: 'staff',
      content: Buffer.from('hello lazy layer\n'),
    },
    { name: 'data/empty', type: 'file', mode: 0o600, content: Buffer.alloc(0) },
    { name: 'data/multi.bin', type: 'file', mode: 0o644, content: randomContent('multi', 5 * CHUNK_SIZE + 12_345) },
    { name: 'data/exact.bin', type: 'file', mode: 0o444, content: randomContent('exact', 2 * CHUNK_SIZE) },
    { name: 'data/text.log', type: 'file', mode: 0o644, content: Buffer.from('compressible line\n'.repeat(40_000)) },
    { name: 'data/link', type: 'symlink', mode: 0o777, linkname: 'small.txt' },
    { name: 'data/abs-link', type: 'symlink', mode: 0o777, linkname: '/etc/prio.conf' },
    { name: 'data/hard', type: 'link', mode: 0o640, linkname: 'data/small.txt', uid: 1000, gid: 1001 },
    { name: 'data/fifo', type: 'fifo', mode: 0o600 },
    { name: 'dev/', type: 'directory', mode: 0o755 },
    { name: 'dev/null', type: 'character-device', mode: 0o666, devmajor: 1, devminor: 3 },
    { name: 'dev/sda', type: 'block-device', mode: 0o660, devmajor: 8, devminor: 0, gid: 6 },
    { name: 'x/', type: 'directory', mode: 0o755, xattrs: { 'user.dir': 'on-a-dir' } },
    {
      name: 'x/attrs',
      type: 'file',
      mode: 0o644,
      content: Buffer.from('xattrs here\n'),
      xattrs: { 'user.comment': 'a <b> & c', 'trusted.note': 'kept' },
    },
    { name: 'odd/', type: 'directory', mode: 0o1777 },
    { name: 'odd/setgid tool', type: 'file', mode: 0o2711, uid: 65534, gid: 65533, content: Buffer.from('#!/bin/sh\necho odd\n') },
    { name: 'implicit/sub/file.txt', type: 'file', mode: 0o644, content: Buffer.from('parents not in the tar\n') },
    { name: 'gone/', type: 'directory', mode: 0o755 },
    { name: 'gone/.wh..wh..opq', type: 'file', mode: 0o644, content: Buffer.alloc(0) },
    { name: 'gone/kept', type: 'file', mode: 0o644, content: Buffer.from('still here\n') },
    { name: 'del/', type: 'directory', mode: 0o755 },
    { name: 'del/.wh.removed', type: 'file', mode: 0o644, content: Buffer.alloc(0) },
    { name: 'del/still', type: 'file', mode: 0o644, content: Buffer.from('not deleted\n') },
    { name: 'big/', type: 'directory', mode: 0o755 },
    { name: 'big/big.bin', type: 'file', mode: 0o644, content: randomContent('big', bigSize) },
  ];
}

export interface BuiltLayer {
  blobPath: string;
  result: BuildResult;
  reader: EstargzReader;
  close(): Promise<void>;
}

/** Builds an eStargz blob from a tar into `dir`; the reader reads it from the local file. */
export async function buildLayer(dir: string, name: string, tar: Buffer, level: number): Promise<BuiltLayer> {
  const blobPath = path.join(dir, `${name}.estargz`);
  const result = await buildEstargz(Readable.from([tar]), createWriteStream(blobPath), {
    chunkSize: CHUNK_SIZE,
    level,
    prioritizedFiles: PRIORITIZED,
    tmpDir: dir,
  });
  const source = await fileSource(blobPath);
  const reader = await openEstargz(source, { tocDigest: result.tocDigest });
  return { blobPath, result, reader, close: () => source.close() };
}

/**
 * A copy of a blob built at gzip level 0 (stored blocks: file bytes appear verbatim) in which
 * one byte of `file` is changed and the member's gzip CRC is recomputed, so the gzip stream is
 * valid and only the chunk digest in the (unchanged) TOC tells the bytes are wrong.
 */
export async function corruptChunkCopy(layer: BuiltLayer, file: string, out: string): Promise<{ digest: string; size: number }> {
  const chunk = layer.reader.lookup(file)?.chunks[0];
  if (!chunk) throw new Error(`${file} has no chunk`);
  const blob = await fsp.readFile(layer.blobPath);
  const member = blob.subarray(chunk.offset, chunk.end);
  const plain = gunzipSync(member);
  const original = plain.subarray(0, chunk.chunkSize);
  // Locate the file's first bytes in the stored block and flip one.
  const at = member.indexOf(original.subarray(0, Math.min(64, original.length)));
  if (at < 0) throw new Error('chunk bytes not stored verbatim (build at level 0)');
  member[at] = member.readUInt8(at) ^ 0x01;
  plain[0] = plain.readUInt8(0) ^ 0x01;
  member.writeUInt32LE(crc32(plain) >>> 0, member.length - 8);
  await fsp.writeFile(out, blob);
  return { digest: `sha256:${createHash('sha256').update(blob).digest('hex')}`, size: blob.length };
}
