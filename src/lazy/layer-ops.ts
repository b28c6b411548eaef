// FUSE operations over a LayerTree: metadata comes from the TOC in memory, file data from the
// ChunkFetcher (cache first, then Range requests).
import { constants } from 'node:fs';
import { Errno, FuseError, type Attr, type DirEntry, type FuseOps } from '../fuse/index.js';
import type { ChunkFetcher } from './chunk-fetcher.js';
import type { LayerNode, LayerTree } from './layer-tree.js';

const WRITE_FLAGS = constants.O_WRONLY | constants.O_RDWR;

export interface LayerOpsHooks {
  /**
   * Called on every successful open of a regular file with its TOC name (the entry holding the
   * data: a hardlink reports its target), before the open is answered. Exec and mmap go through
   * open too. Used to record what a workload reads; must be cheap and must not throw.
   */
  onAccess?: (path: string) => void;
}

export function layerOps(tree: LayerTree, fetcher: ChunkFetcher, hooks: LayerOpsHooks = {}): FuseOps {
  const onAccess = hooks.onAccess;
  const listings = new Map<number, DirEntry[]>(); // built on first readdir of each directory

  const node = (ino: number): LayerNode => {
    const found = tree.get(ino);
    if (!found) throw new FuseError(Errno.ENOENT, `no inode ${ino}`);
    return found;
  };
  const listing = (dir: LayerNode): DirEntry[] => {
    let entries = listings.get(dir.ino);
    if (!entries) {
      const named: Array<[string, Attr]> = [
        ['.', dir.attr],
        ['..', (dir.parent ?? dir).attr],
      ];
      for (const [name, child] of dir.children ?? []) named.push([name, child.attr]);
      entries = named.map(([name, attr], i) => ({ name, attr, off: i + 1 }));
      listings.set(dir.ino, entries);
    }
    return entries;
  };

  return {
    lookup(parent, name) {
      const dir = node(parent);
      if (!dir.children) throw new FuseError(Errno.ENOTDIR);
      const child = dir.children.get(name);
      if (!child) throw new FuseError(Errno.ENOENT);
      return child.attr;
    },
    getattr: (ino) => node(ino).attr,
    readlink(ino) {
      const entry = node(ino).entry;
      if (entry?.type !== 'symlink') throw new FuseError(Errno.EINVAL);
      return entry.linkName;
    },
    open(ino, flags) {
      const target = node(ino);
      if (target.children) throw new FuseError(Errno.EISDIR);
      if (flags & WRITE_FLAGS) throw new FuseError(Errno.EROFS);
      if (onAccess && target.entry?.type === 'reg') onAccess(target.entry.name);
      return { fh: 0 };
    },
    async read(ino, _fh, offset, size) {
      const entry = node(ino).entry;
      if (entry?.type !== 'reg') throw new FuseError(Errno.EINVAL);
      const length = Math.min(size, entry.size - offset);
      if (length <= 0) return Buffer.alloc(0);
      // Cached chunks go to the kernel straight from their files; the others are fetched first.
      return (await fetcher.fileSegments(entry.chunks, offset, length)) ?? fetcher.readFile(entry.chunks, offset, length);
    },
    opendir(ino) {
      if (!node(ino).children) throw new FuseError(Errno.ENOTDIR);
      return { fh: 0 };
    },
    readdir(ino, _fh, offset) {
      const dir = node(ino);
      if (!dir.children) throw new FuseError(Errno.ENOTDIR);
      return listing(dir).slice(offset);
    },
    statfs() {
      const blocks = Math.ceil(tree.dataBytes / 4096);
      return { bsize: 4096, blocks, bfree: 0, bavail: 0, files: tree.size, ffree: 0, namemax: 255 };
    },
    getxattr(ino, name) {
      const value = tree.xattrs(node(ino)).get(name);
      if (!value) throw new FuseError(Errno.ENODATA);
      return value;
    },
    listxattr: (ino) => [...tree.xattrs(node(ino)).keys()],
  };
}
