/** Inode attributes as handed to the kernel (atime and ctime are the mtime). */
export interface Attr {
  ino: number;
  /** File type and permission bits (S_IFREG | 0o644, ...). */
  mode: number;
  nlink: number;
  uid: number;
  gid: number;
  /** Device number of char/block devices (makedev(major, minor)). */
  rdev: number;
  size: number;
  /** 512-byte blocks; default ceil(size / 512). */
  blocks?: number;
  blksize?: number;
  mtimeSec: number;
  mtimeNsec: number;
}

export interface DirEntry {
  name: string;
  /** Offset of the entry after this one: the kernel resumes readdir from it. */
  off: number;
  attr: Attr;
}

export interface OpenResult {
  fh: number;
  /** Bypass the page cache for this file (default: the mount's directIo option). */
  directIo?: boolean;
  /** Keep cached pages across opens (default: the mount's keepCache option). */
  keepCache?: boolean;
}

export interface Statfs {
  bsize: number;
  blocks: number;
  bfree: number;
  bavail: number;
  files: number;
  ffree: number;
  namemax: number;
}

type MaybePromise<T> = T | Promise<T>;

/**
 * File data that lies in open files: libfuse reads it from them and sends it to the kernel
 * without it passing through JavaScript. `release` is called once it has been sent (or not).
 */
export interface FileSegments {
  segments: Array<{ fd: number; offset: number; length: number }>;
  release(): void;
}

/**
 * A read-only file system. Throw a FuseError to answer with an errno; any other error is
 * answered with EIO (and reported through the mount's onError). Handlers may be async: the
 * kernel request stays open until they settle. Inode 1 is the root.
 */
export interface FuseOps {
  lookup(parent: number, name: string): MaybePromise<Attr>;
  getattr(ino: number): MaybePromise<Attr>;
  readlink(ino: number): MaybePromise<string>;
  open(ino: number, flags: number): MaybePromise<OpenResult>;
  read(ino: number, fh: number, offset: number, size: number): MaybePromise<Buffer | FileSegments>;
  release?(ino: number, fh: number): MaybePromise<void>;
  opendir?(ino: number, flags: number): MaybePromise<OpenResult>;
  /** Entries from `offset` on (0: from the start, including "." and ".."); extra entries are fine. */
  readdir(ino: number, fh: number, offset: number, plus: boolean): MaybePromise<DirEntry[]>;
  releasedir?(ino: number, fh: number): MaybePromise<void>;
  statfs?(ino: number): MaybePromise<Statfs>;
  /** The value, or throw ENODATA. */
  getxattr?(ino: number, name: string): MaybePromise<Buffer>;
  listxattr?(ino: number): MaybePromise<string[]>;
  /** The kernel dropped `nlookup` references to `ino` (informational). */
  forget?(ino: number, nlookup: number): void;
}

export interface FuseOptions {
  /** Name shown in /proc/mounts (source column); default "starling". */
  fsName?: string;
  /** Type suffix: the mount shows as fuse.<subtype>; default "starling". */
  subtype?: string;
  /** Mount read-only (default true). */
  readOnly?: boolean;
  /** Let other users (containers) in; default true. */
  allowOther?: boolean;
  /** Let the kernel check permissions from the modes (default true). */
  defaultPermissions?: boolean;
  /** Honour setuid/setgid bits (default true, as stargz-snapshotter); device nodes stay off unless `dev`. */
  suid?: boolean;
  dev?: boolean;
  /** Largest read request, in bytes (mount option max_read); default: the kernel's (1 MiB with max_pages). */
  maxRead?: number;
  /** Kernel read-ahead, in bytes; can only lower the kernel's default. */
  maxReadahead?: number;
  /** Outstanding background (async read-ahead) requests the kernel may queue; default 64. */
  maxBackground?: number;
  /** Seconds the kernel caches name lookups and attributes (default 1 and 1; immutable layers may use more). */
  entryTimeout?: number;
  attrTimeout?: number;
  /** Every open bypasses the page cache (default false). */
  directIo?: boolean;
  /** Keep the page cache across opens (default true: layers never change). */
  keepCache?: boolean;
  /** Called with errors a handler threw that were not FuseErrors (they were answered with EIO). */
  onError?: (error: unknown, op: string) => void;
}
