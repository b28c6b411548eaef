// One image layer as a reproducible tar.gz: entries sorted by path, every mtime the same, owners
// given explicitly (never the build machine's), parent folders always present. The same entries
// give the same bytes, so the same commit gives the same layer digests.

import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { lstat, readdir, readlink } from 'node:fs/promises';
import { posix, join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { PassThrough, Transform } from 'node:stream';
import { createGzip } from 'node:zlib';
import tar, { type Pack } from 'tar-stream';

export type LayerEntry =
  | { type: 'dir'; path: string; mode: number; uid?: number; gid?: number }
  | { type: 'file'; path: string; mode: number; source: string; size: number; uid?: number; gid?: number }
  | { type: 'symlink'; path: string; target: string };

export interface WrittenLayer {
  /** sha256 of the compressed blob (the manifest's digest). */
  digest: string;
  /** sha256 of the uncompressed tar (the config's diff_id). */
  diffId: string;
  size: number;
}

/** Adds every file, folder and symlink under `sourceDir` at `imageDir`, skipping what `keep` refuses. */
export async function addTree(
  entries: Map<string, LayerEntry>,
  sourceDir: string,
  imageDir: string,
  keep: (relative: string, isDir: boolean) => boolean = () => true,
): Promise<void> {
  const walk = async (relative: string): Promise<void> => {
    for (const name of (await readdir(join(sourceDir, relative))).sort()) {
      const rel = relative ? `${relative}/${name}` : name;
      const info = await lstat(join(sourceDir, rel));
      if (!keep(rel, info.isDirectory())) continue;
      const path = posix.join(imageDir, rel);
      if (info.isSymbolicLink()) entries.set(path, { type: 'symlink', path, target: await readlink(join(sourceDir, rel)) });
      else if (info.isDirectory()) {
        entries.set(path, { type: 'dir', path, mode: info.mode & 0o7777 });
        await walk(rel);
      } else if (info.isFile())
        entries.set(path, { type: 'file', path, mode: info.mode & 0o7777, source: join(sourceDir, rel), size: info.size });
      // sockets, fifos and devices have no place in an image
    }
  };
  await walk('');
}

/** Writes the entries as a gzip'd tar to `file`; `mtime` is every entry's modification time. */
export async function writeLayer(entries: Map<string, LayerEntry>, file: string, mtime: Date): Promise<WrittenLayer> {
  const all = withParents(entries);
  const pack = tar.pack();
  const diffHash = createHash('sha256');
  const blobHash = createHash('sha256');
  let size = 0;
  const hashing = (hash: ReturnType<typeof createHash>, count = false) =>
    new Transform({
      transform(chunk: Buffer, _encoding, done) {
        hash.update(chunk);
        if (count) size += chunk.length;
        done(null, chunk);
      },
    });
  // Level 6: about 50 MB/s on one core here, against 7 MB/s for level 9 and a few percent smaller.
  const written = pipeline(pack, hashing(diffHash), createGzip({ level: 6 }), hashing(blobHash, true), createWriteStream(file));
  for (const entry of [...all.values()].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0))) {
    const name = entry.path.replace(/^\//, '');
    const common = { mtime, uid: 0, gid: 0, uname: '', gname: '' };
    if (entry.type === 'dir') {
      await addEntry(pack, { ...common, name: `${name}/`, type: 'directory', mode: entry.mode, uid: entry.uid ?? 0, gid: entry.gid ?? 0 });
    } else if (entry.type === 'symlink') {
      await addEntry(pack, { ...common, name, type: 'symlink', linkname: entry.target, mode: 0o777 });
    } else {
      await addEntry(
        pack,
        { ...common, name, type: 'file', mode: entry.mode, size: entry.size, uid: entry.uid ?? 0, gid: entry.gid ?? 0 },
        entry.source,
      );
    }
  }
  pack.finalize();
  await written;
  return { digest: `sha256:${blobHash.digest('hex')}`, diffId: `sha256:${diffHash.digest('hex')}`, size };
}

/** Every parent folder of every entry, as a 0755 root-owned folder unless given. */
function withParents(entries: Map<string, LayerEntry>): Map<string, LayerEntry> {
  const all = new Map(entries);
  for (const entry of entries.values()) {
    for (let dir = posix.dirname(entry.path); dir !== '/' && dir !== '.'; dir = posix.dirname(dir)) {
      if (!all.has(dir)) all.set(dir, { type: 'dir', path: dir, mode: 0o755 });
    }
  }
  return all;
}

function addEntry(pack: Pack, header: Parameters<Pack['entry']>[0], source?: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const done = (error?: Error | null) => (error ? reject(error) : resolve());
    if (!source) {
      pack.entry(header, Buffer.alloc(0), done); // a folder or a link: no body
      return;
    }
    pipeline(createReadStream(source), pack.entry(header, done) as unknown as PassThrough).catch(reject);
  });
}
