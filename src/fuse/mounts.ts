// What the kernel says is mounted, and how to clear a FUSE mount whose server is gone (the
// snapshotter was killed: every access then fails with ENOTCONN until it is unmounted).
import fsp from 'node:fs/promises';
import path from 'node:path';
import { loadAddon } from './native.js';

export interface MountInfo {
  mountpoint: string;
  /** e.g. "fuse.starling", "overlay", "ext4". */
  fsType: string;
  source: string;
}

/** Mounts from /proc/self/mountinfo, optionally only those at or below `under`. */
export async function listMounts(under?: string): Promise<MountInfo[]> {
  const text = await fsp.readFile('/proc/self/mountinfo', 'utf8');
  const root = under ? path.resolve(under) : undefined;
  const out: MountInfo[] = [];
  for (const line of text.split('\n')) {
    // id parent major:minor root mountpoint options [optional fields...] - fstype source superopts
    const fields = line.split(' ');
    const dash = fields.indexOf('-');
    const field = fields[4];
    if (field === undefined || dash < 0) continue;
    const mountpoint = unescapeMountPath(field);
    if (root && mountpoint !== root && !mountpoint.startsWith(root + '/')) continue;
    out.push({ mountpoint, fsType: fields[dash + 1] ?? '', source: unescapeMountPath(fields[dash + 2] ?? '') });
  }
  return out;
}

/** The topmost mount exactly at `target`, if any. */
export async function findMount(target: string): Promise<MountInfo | undefined> {
  const resolved = path.resolve(target);
  return (await listMounts(resolved)).filter((m) => m.mountpoint === resolved).pop();
}

export type MountHealth = 'absent' | 'alive' | 'dead';

/**
 * Whether a FUSE mount is at `target` and answers. 'dead' means the kernel still has it but
 * its server is gone (ENOTCONN/ECONNABORTED). Checked with statfs, which the kernel always asks
 * the server (a stat may be answered from cached attributes). Async, off the JS thread; still,
 * never use it on a mount this very process serves while its loop is expected to be stuck.
 */
export async function fuseMountHealth(target: string): Promise<MountHealth> {
  const mount = await findMount(target);
  if (!mount || !mount.fsType.startsWith('fuse')) return 'absent';
  try {
    await fsp.statfs(mount.mountpoint);
    return 'alive';
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === 'ENOTCONN' || code === 'ECONNABORTED') return 'dead';
    throw error;
  }
}

/** Detaches whatever is mounted at `target` (umount2 MNT_DETACH, off the JS thread). */
export async function detachMount(target: string): Promise<void> {
  const errno = await loadAddon().umount(path.resolve(target), true);
  if (errno !== 0) throw Object.assign(new Error(`umount -l ${target}: errno ${errno}`), { errno });
}

// mountinfo escapes space, tab, newline and backslash as octal.
function unescapeMountPath(p: string): string {
  return p.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
}
