import fsp from 'node:fs/promises';
import path from 'node:path';
import { Errno, FuseError } from './errno.js';
import { findMount } from './mounts.js';
import { loadAddon, OpCode, type NativeSession } from './native.js';
import type { FileSegments, FuseOps, FuseOptions } from './types.js';

export interface FuseExit {
  /** True when unmount() ended the session; false when it was unmounted or aborted from outside. */
  requested: boolean;
  /** fuse_session_loop's result (0, or a negative errno). */
  loopResult: number;
}

export interface FuseMount {
  readonly mountpoint: string;
  /** True until the session has ended. */
  readonly alive: boolean;
  /** Resolves when the session ends, however that happens. */
  readonly closed: Promise<FuseExit>;
  /**
   * Unmounts. By default fails with EBUSY (and keeps serving) while files are open; `lazy`
   * detaches at once and keeps serving open files until they are closed (`closed` then resolves).
   */
  unmount(options?: { lazy?: boolean }): Promise<void>;
  /** Kernel requests still waiting for an answer from JS. */
  pendingRequests(): number;
}

const OP_NAMES = Object.fromEntries(Object.entries(OpCode).map(([name, code]) => [code, name.toLowerCase()])) as Record<number, string>;

/**
 * Mounts `ops` at `mountpoint` (an existing directory) with libfuse's low-level API. The
 * session loop runs on a native thread; every request comes to this thread and is answered
 * when its handler settles, so slow handlers (network fetches) never hold others up.
 * Never access the mount synchronously from this thread: the answer could never be sent.
 */
export async function mountFuse(mountpoint: string, ops: FuseOps, options: FuseOptions = {}): Promise<FuseMount> {
  const addon = loadAddon();
  const target = path.resolve(mountpoint);
  const entryTimeout = options.entryTimeout ?? 1;
  const attrTimeout = options.attrTimeout ?? 1;
  const directIo = options.directIo ?? false;
  const keepCache = options.keepCache ?? true;
  const report = options.onError ?? (() => {});

  let session!: NativeSession;
  let alive = true;
  let resolveClosed!: (exit: FuseExit) => void;
  const closed = new Promise<FuseExit>((resolve) => (resolveClosed = resolve));

  // Runs `handler`, then `answer` with its result, or replies with the errno it threw.
  const settle = <T>(id: number, op: number, handler: () => T | Promise<T>, answer: (value: T) => void): void => {
    const fail = (error: unknown) => {
      if (error instanceof FuseError) session.replyErr(id, error.errno);
      else {
        report(error, OP_NAMES[op] ?? String(op));
        session.replyErr(id, Errno.EIO);
      }
    };
    try {
      const result = handler();
      if (result instanceof Promise) result.then(answer, fail);
      else answer(result);
    } catch (error) {
      fail(error);
    }
  };
  const replyFromFiles = (id: number, data: FileSegments): void => {
    try {
      session.replyFds(
        id,
        data.segments.flatMap((s) => [s.fd, s.offset, s.length]),
      );
    } finally {
      data.release();
    }
  };
  const noSuchOp = (): never => {
    throw new FuseError(Errno.ENOSYS);
  };

  const dispatch = (op: OpCode, id: number, ino: number, size: number, off: number, fh: number, last: number, name: string): void => {
    switch (op) {
      case OpCode.Lookup:
        return settle(
          id,
          op,
          () => ops.lookup(ino, name),
          (attr) => session.replyEntry(id, attr, entryTimeout, attrTimeout),
        );
      case OpCode.Forget:
        ops.forget?.(ino, last);
        return;
      case OpCode.Getattr:
        return settle(
          id,
          op,
          () => ops.getattr(ino),
          (attr) => session.replyAttr(id, attr, attrTimeout),
        );
      case OpCode.Readlink:
        return settle(
          id,
          op,
          () => ops.readlink(ino),
          (target) => session.replyReadlink(id, target),
        );
      case OpCode.Open:
        return settle(
          id,
          op,
          () => ops.open(ino, last),
          (r) => session.replyOpen(id, r.fh, r.directIo ?? directIo, r.keepCache ?? keepCache),
        );
      case OpCode.Read:
        return settle(
          id,
          op,
          () => ops.read(ino, fh, off, size),
          (data) => (Buffer.isBuffer(data) ? session.replyBuf(id, data) : replyFromFiles(id, data)),
        );
      case OpCode.Release:
        return settle(
          id,
          op,
          () => ops.release?.(ino, fh),
          () => session.replyErr(id, 0),
        );
      case OpCode.Opendir:
        return settle(
          id,
          op,
          () => (ops.opendir ? ops.opendir(ino, last) : { fh: 0 }),
          (r) => session.replyOpen(id, r.fh, false, r.keepCache ?? keepCache),
        );
      case OpCode.Readdir:
      case OpCode.Readdirplus:
        return settle(
          id,
          op,
          () => ops.readdir(ino, fh, off, op === OpCode.Readdirplus),
          (entries) => session.replyDir(id, entries, entryTimeout, attrTimeout),
        );
      case OpCode.Releasedir:
        return settle(
          id,
          op,
          () => ops.releasedir?.(ino, fh),
          () => session.replyErr(id, 0),
        );
      case OpCode.Statfs:
        return settle(
          id,
          op,
          () => (ops.statfs ? ops.statfs(ino) : noSuchOp()),
          (st) => session.replyStatfs(id, st),
        );
      case OpCode.Getxattr:
        return settle(
          id,
          op,
          () => (ops.getxattr ? ops.getxattr(ino, name) : noSuchOp()),
          (value) => session.replyXattr(id, value),
        );
      case OpCode.Listxattr:
        return settle(
          id,
          op,
          () => (ops.listxattr ? ops.listxattr(ino) : []),
          (names) => session.replyXattr(id, Buffer.from(names.map((n) => `${n}\0`).join(''))),
        );
      default:
        session.replyErr(id, Errno.ENOSYS);
    }
  };

  const onExit = (loopResult: number, requested: boolean) => {
    alive = false;
    // Ended from outside (umount by someone else, connection aborted): a dead mount may remain;
    // take it away so the path is usable again.
    const cleanup = requested ? Promise.resolve() : removeIfFuse(target, options.subtype ?? 'starling');
    void cleanup.finally(() => resolveClosed({ requested, loopResult }));
  };

  const settings = { maxReadahead: options.maxReadahead ?? 0, maxBackground: options.maxBackground ?? 64, congestionThreshold: 0 };
  settings.congestionThreshold = Math.floor((settings.maxBackground * 3) / 4);
  await assertDirectory(target);
  session = new addon.Session(target, mountOptions(options), settings, dispatch, onExit);
  await session.mount();

  return {
    mountpoint: target,
    get alive() {
      return alive;
    },
    closed,
    async unmount(opts = {}) {
      if (!alive) return;
      const errno = await session.unmount(opts.lazy ?? false);
      if (errno !== 0)
        throw Object.assign(new Error(`unmount ${target}: errno ${errno}${errno === Errno.EBUSY ? ' (busy)' : ''}`), { errno });
      if (!opts.lazy) await closed;
    },
    pendingRequests: () => (alive ? session.pendingCount() : 0),
  };
}

function mountOptions(options: FuseOptions): string {
  const opts = [`fsname=${options.fsName ?? 'starling'}`, `subtype=${options.subtype ?? 'starling'}`];
  if (options.readOnly ?? true) opts.push('ro');
  if (options.allowOther ?? true) opts.push('allow_other');
  if (options.defaultPermissions ?? true) opts.push('default_permissions');
  opts.push((options.suid ?? true) ? 'suid' : 'nosuid');
  opts.push(options.dev ? 'dev' : 'nodev');
  if (options.maxRead) opts.push(`max_read=${options.maxRead}`);
  for (const o of opts) {
    if (/[,\\]/.test(o)) throw new Error(`invalid FUSE mount option "${o}"`);
  }
  return opts.join(',');
}

async function assertDirectory(target: string): Promise<void> {
  const st = await fsp.stat(target);
  if (!st.isDirectory()) throw new Error(`mountpoint ${target} is not a directory`);
}

async function removeIfFuse(target: string, subtype: string): Promise<void> {
  const mount = await findMount(target);
  if (mount?.fsType === `fuse.${subtype}`) await loadAddon().umount(target, true);
}
