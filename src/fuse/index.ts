/** FUSE mounts served from JavaScript: a libfuse3 low-level session per mount (native/fuse). */
export { mountFuse, type FuseMount, type FuseExit } from './mount.js';
export { requireFuseAddon } from './native.js';
export { Errno, FuseError } from './errno.js';
export { listMounts, findMount, fuseMountHealth, detachMount } from './mounts.js';
export type { Attr, DirEntry, FileSegments, FuseOps, FuseOptions } from './types.js';
export { S_IFDIR, S_IFREG, S_IFLNK, S_IFCHR, S_IFBLK, S_IFIFO, makedev } from './modes.js';
