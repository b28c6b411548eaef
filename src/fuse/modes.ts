/** File type bits of st_mode (Linux). */
export const S_IFDIR = 0o040000;
export const S_IFREG = 0o100000;
export const S_IFLNK = 0o120000;
export const S_IFCHR = 0o020000;
export const S_IFBLK = 0o060000;
export const S_IFIFO = 0o010000;

/** glibc's makedev: the st_rdev of a device node. */
export function makedev(major: number, minor: number): number {
  // Bits: minor 0-7, major 8-19, minor 20-39, major 40-63 (kept below 2^53 for numbers).
  return (minor & 0xff) + (major & 0xfff) * 0x100 + Math.floor(minor / 0x100) * 0x100000 + Math.floor(major / 0x1000) * 0x100000000000;
}
