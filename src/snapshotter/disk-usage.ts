// Disk use of a directory tree as containerd reports it: allocated bytes (st_blocks × 512) and
// inodes, each inode counted once (hardlinks). Never called on a FUSE mountpoint.
import fsp from 'node:fs/promises';
import path from 'node:path';

export interface Usage {
  size: number;
  inodes: number;
}

export async function diskUsage(dir: string): Promise<Usage> {
  const seen = new Set<string>();
  const usage: Usage = { size: 0, inodes: 0 };
  const visit = async (p: string): Promise<void> => {
    let st;
    try {
      st = await fsp.lstat(p, { bigint: true });
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return; // removed meanwhile
      throw error;
    }
    const inode = `${st.dev}:${st.ino}`;
    if (!seen.has(inode)) {
      seen.add(inode);
      usage.inodes++;
      usage.size += Number(st.blocks) * 512;
    }
    if (st.isDirectory()) {
      for (const name of await fsp.readdir(p)) await visit(path.join(p, name));
    }
  };
  await visit(dir);
  return usage;
}
