/** FUSE mounts served from JavaScript: a libfuse3 low-level session per mount (native/fuse). */
export { mountFuse, type FuseMount, type FuseExit } from './mount.js';
export { requireFuseAddon } from './native.js';
export { Errno, FuseError, type ErrnoName } from './errno.js';
export { listMounts, findMount, fuseMountHealth, detachMount, type MountInfo, type MountHealth } from './mounts.js';
export type { Attr, DirEntry, FileSegments, FuseOps, FuseOptions, OpenResult, Statfs } from './types.js';
export { S_IFMT, S_IFDIR, S_IFREG, S_IFLNK, S_IFCHR, S_IFBLK, S_IFIFO, makedev } from './modes.js';
