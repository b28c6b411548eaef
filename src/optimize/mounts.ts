// Mounts left below a work dir, from /proc/self/mountinfo: a temp dir is never removed while a
// mount lives in it (rm -r would walk into the image).
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';

/** Mount points at or below `dir`, deepest first. */
export function mountsBelow(dir: string): string[] {
  const root = path.resolve(dir);
  let text: string;
  try {
    text = readFileSync('/proc/self/mountinfo', 'utf8');
  } catch {
    return [];
  }
  const points = text
    .split('\n')
    .map((line) => line.split(' ')[4])
    .filter((p): p is string => Boolean(p))
    // mountinfo escapes space, tab, newline and backslash as octal
    .map((p) => p.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(parseInt(octal, 8))))
    .filter((p) => p === root || p.startsWith(`${root}/`));
  return [...new Set(points)].sort((a, b) => b.length - a.length);
}

/**
 * Detaches (umount -l) every mount at or below `dir`, synchronously: for exit paths. A FUSE
 * mount served by this process must not be touched from this thread, so the work is done by
 * umount(8) in a child process, which does not read the mount's content.
 */
export function unmountBelowSync(dir: string): void {
  for (const point of mountsBelow(dir)) {
    try {
      execFileSync('umount', ['-l', point], { stdio: 'ignore', timeout: 10_000 });
    } catch {
      // already gone
    }
  }
}
