// The compiled addon (native/fuse), loaded through common/native-addon.ts (from src/ under tsx
// and from dist/ alike).
import { requiredAddon } from '../common/native-addon.js';
import type { Attr, DirEntry, Statfs } from './types.js';

/** Operation codes; the same numbers as `enum class Op` in native/fuse/src/session.h. */
export const OpCode = {
  Lookup: 1,
  Forget: 2,
  Getattr: 3,
  Readlink: 4,
  Open: 5,
  Read: 6,
  Release: 7,
  Opendir: 8,
  Readdir: 9,
  Readdirplus: 10,
  Releasedir: 11,
  Statfs: 12,
  Getxattr: 13,
  Listxattr: 14,
} as const;
export type OpCode = (typeof OpCode)[keyof typeof OpCode];

/**
 * Called on the JS thread for every kernel request: `id` is 0 for forget (which needs no
 * answer); `last` is the open flags, or the nlookup of a forget.
 */
export type Dispatch = (op: OpCode, id: number, ino: number, size: number, off: number, fh: number, last: number, name: string) => void;

export interface NativeSession {
  mount(): Promise<void>;
  /** Resolves with 0 once the mount left the namespace, or an errno (EBUSY) when it did not. */
  unmount(lazy: boolean): Promise<number>;
  // Each returns false when the request is no longer pending (answered, or its session ended).
  replyErr(id: number, errno: number): boolean;
  replyEntry(id: number, attr: Attr, entryTimeout: number, attrTimeout: number): boolean;
  replyAttr(id: number, attr: Attr, attrTimeout: number): boolean;
  replyReadlink(id: number, target: string): boolean;
  replyOpen(id: number, fh: number, directIo: boolean, keepCache: boolean): boolean;
  replyBuf(id: number, data: Buffer): boolean;
  /** File data from open descriptors: [fd, offset, length, fd, offset, length, …]. */
  replyFds(id: number, segments: number[]): boolean;
  replyDir(id: number, entries: DirEntry[], entryTimeout: number, attrTimeout: number): boolean;
  replyStatfs(id: number, st: Statfs): boolean;
  replyXattr(id: number, data: Buffer): boolean;
  pendingCount(): number;
}

export interface NativeAddon {
  Session: new (
    mountpoint: string,
    options: string,
    settings: { maxReadahead: number; maxBackground: number; congestionThreshold: number },
    dispatch: Dispatch,
    onExit: (loopResult: number, unmountRequested: boolean) => void,
  ) => NativeSession;
  /** umount2(path, lazy ? MNT_DETACH : 0) on a worker thread; resolves with 0 or the errno. */
  umount(path: string, lazy: boolean): Promise<number>;
  /** libfuse's version, e.g. 314. */
  fuseVersion: number;
}

/** What to run when the addon is missing: `npm ci` skips it on a machine without libfuse3's headers. */
const HOW_TO_GET =
  'lazy pulling needs it: install libfuse3 (`apt-get install fuse3 libfuse3-dev pkg-config`), then run `npm run build:fuse`';

export function loadAddon(): NativeAddon {
  return requiredAddon<NativeAddon>('fuse', 'starling_fuse', HOW_TO_GET);
}

/**
 * Throws, saying what is missing and how to get it, unless the addon loads: the commands that
 * mount call this first, so a machine without it learns that at start, not at the first mount.
 */
export function requireFuseAddon(): void {
  loadAddon();
}
