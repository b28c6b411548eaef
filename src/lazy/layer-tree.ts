// The file tree of an eStargz layer as FUSE sees it: inode numbers, attributes and directory
// listings built once from the TOC. Hardlinks share their target's inode.
//
// Whiteouts follow stargz-snapshotter (fs/layer/node.go), since the mount is an overlayfs
// lowerdir and overlayfs does not understand the tar format's `.wh.` files:
//  - `.wh.<name>` is hidden and shown as `<name>`, a 0/0 character device owned by root (an
//    overlayfs whiteout), unless the layer also has a real `<name>` there;
//  - `.wh..wh..opq` is hidden and makes its directory opaque: getxattr of the opaque xattrs
//    (default trusted.overlay.opaque) answers "y";
//  - `.prefetch.landmark` and `.no.prefetch.landmark` are hidden in the root.
// `whiteouts: 'raw'` shows the TOC exactly as stored instead.
import { NO_PREFETCH_LANDMARK, PREFETCH_LANDMARK, type EstargzEntry, type EstargzReader } from '../estargz/index.js';
import { makedev, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFREG, type Attr } from '../fuse/index.js';

export const ROOT_INO = 1;
export const WHITEOUT_PREFIX = '.wh.';
export const OPAQUE_WHITEOUT = '.wh..wh..opq';
export const DEFAULT_OPAQUE_XATTRS = ['trusted.overlay.opaque'];

export type WhiteoutMode = 'overlayfs' | 'raw';

export interface LayerNode {
  ino: number;
  attr: Attr;
  /** The TOC entry holding the data (a hardlink's target); undefined for implicit directories and whiteouts. */
  entry?: EstargzEntry;
  /** Directories: children by name, in TOC order. */
  children?: Map<string, LayerNode>;
  parent?: LayerNode;
  /** Directories holding `.wh..wh..opq` (overlayfs mode). */
  opaque: boolean;
}

export interface TreeOptions {
  whiteouts?: WhiteoutMode;
  /** xattrs that mark an opaque directory (overlayfs mode). */
  opaqueXattrs?: string[];
}

const TYPE_BITS: Record<EstargzEntry['type'], number> = {
  dir: S_IFDIR,
  reg: S_IFREG,
  symlink: S_IFLNK,
  hardlink: S_IFREG,
  char: S_IFCHR,
  block: S_IFBLK,
  fifo: S_IFIFO,
};

export class LayerTree {
  readonly root: LayerNode;
  private readonly nodes: LayerNode[] = [];
  /** Total bytes of regular file data, counted once per inode. */
  readonly dataBytes: number;

  constructor(
    reader: EstargzReader,
    readonly options: TreeOptions = {},
  ) {
    const overlay = (options.whiteouts ?? 'overlayfs') === 'overlayfs';
    this.root = this.newNode(implicitDirAttr(), undefined);
    this.root.children = new Map();
    const byName = new Map<string, LayerNode>([['', this.root]]);
    const whiteouts: Array<[LayerNode, string, EstargzEntry]> = [];
    const hardlinks: EstargzEntry[] = [];

    for (const entry of reader.entries) {
      if (entry.name === '') {
        this.root.entry = entry;
        this.root.attr = { ...entryAttr(entry, ROOT_INO), nlink: 2 };
        continue;
      }
      const { dir, base } = split(entry.name);
      const parent = this.directory(dir, byName);
      if (overlay) {
        if (base === OPAQUE_WHITEOUT) {
          parent.opaque = true;
          continue;
        }
        if (base.startsWith(WHITEOUT_PREFIX)) {
          whiteouts.push([parent, base.slice(WHITEOUT_PREFIX.length), entry]);
          continue;
        }
        if (parent === this.root && (base === PREFETCH_LANDMARK || base === NO_PREFETCH_LANDMARK)) continue;
      }
      if (entry.type === 'hardlink') {
        hardlinks.push(entry);
        continue;
      }
      const existing = byName.get(entry.name);
      if (existing) {
        // An implicit directory created for an earlier child; the real entry brings its attributes.
        existing.entry = entry;
        existing.attr = { ...entryAttr(entry, existing.ino), nlink: existing.attr.nlink };
        continue;
      }
      const node = this.newNode(undefined, entry);
      if (entry.type === 'dir') node.children = new Map();
      this.link(parent, base, node);
      byName.set(entry.name, node);
    }
    // Hardlinks after everything else: their target may come later in the TOC.
    for (const entry of hardlinks) {
      const target = byName.get(resolveTargetName(entry, reader));
      if (!target) continue; // indexToc already refused dangling links; a hidden target (whiteout) stays hidden
      const { dir, base } = split(entry.name);
      this.link(this.directory(dir, byName), base, target);
      target.attr.nlink++;
      byName.set(entry.name, target);
    }
    for (const [parent, name, entry] of whiteouts) {
      if (parent.children?.has(name)) continue;
      const node = this.newNode(undefined, undefined);
      node.attr = { ...node.attr, mode: S_IFCHR, nlink: 1, uid: 0, gid: 0, rdev: 0, size: 0, ...mtime(entry.modtime) };
      this.link(parent, name, node);
    }
    let bytes = 0;
    for (const node of this.nodes) if (node.entry?.type === 'reg') bytes += node.entry.size;
    this.dataBytes = bytes;
  }

  get(ino: number): LayerNode | undefined {
    return this.nodes[ino - 1];
  }

  get size(): number {
    return this.nodes.length;
  }

  /** Every node once (hardlinks are one node). */
  all(): readonly LayerNode[] {
    return this.nodes;
  }

  /** The xattrs getxattr/listxattr show: the TOC's, plus the opaque marker on opaque directories. */
  xattrs(node: LayerNode): Map<string, Buffer> {
    const out = new Map<string, Buffer>(Object.entries(node.entry?.xattrs ?? {}));
    if (node.opaque) for (const name of this.options.opaqueXattrs ?? DEFAULT_OPAQUE_XATTRS) out.set(name, Buffer.from('y'));
    return out;
  }

  private newNode(attr: Attr | undefined, entry: EstargzEntry | undefined): LayerNode {
    const ino = this.nodes.length + 1;
    const node: LayerNode = {
      ino,
      attr: attr ? { ...attr, ino } : entry ? entryAttr(entry, ino) : { ...implicitDirAttr(), ino },
      entry,
      opaque: false,
    };
    this.nodes.push(node);
    return node;
  }

  private link(parent: LayerNode, name: string, node: LayerNode): void {
    if (!parent.children) throw new Error(`cannot link "${name}" under a node that is not a directory`);
    parent.children.set(name, node);
    if (node.children) {
      node.parent = parent;
      parent.attr.nlink++;
    }
  }

  /** The directory node for `dir`, creating missing (implicit) parents like Go's reader does. */
  private directory(dir: string, byName: Map<string, LayerNode>): LayerNode {
    const found = byName.get(dir);
    if (found?.children) return found;
    const { dir: up, base } = split(dir);
    const parent = this.directory(up, byName);
    const node = this.newNode(implicitDirAttr(), undefined);
    node.children = new Map();
    this.link(parent, base, node);
    byName.set(dir, node);
    return node;
  }
}

function split(name: string): { dir: string; base: string } {
  const slash = name.lastIndexOf('/');
  return slash < 0 ? { dir: '', base: name } : { dir: name.slice(0, slash), base: name.slice(slash + 1) };
}

function resolveTargetName(entry: EstargzEntry, reader: EstargzReader): string {
  let current = entry;
  while (current.type === 'hardlink') {
    const next = reader.lookup(current.linkName);
    if (!next) return '';
    current = next;
  }
  return current.name;
}

function implicitDirAttr(): Attr {
  return { ino: 0, mode: S_IFDIR | 0o755, nlink: 2, uid: 0, gid: 0, rdev: 0, size: 0, mtimeSec: 0, mtimeNsec: 0 };
}

function entryAttr(entry: EstargzEntry, ino: number): Attr {
  const size = entry.type === 'reg' ? entry.size : entry.type === 'symlink' ? Buffer.byteLength(entry.linkName) : 0;
  const isDevice = entry.type === 'char' || entry.type === 'block';
  return {
    ino,
    mode: TYPE_BITS[entry.type] | (entry.mode & 0o7777),
    nlink: entry.type === 'dir' ? 2 : 1,
    uid: entry.uid,
    gid: entry.gid,
    rdev: isDevice ? makedev(entry.devMajor, entry.devMinor) : 0,
    size,
    blksize: 4096,
    ...mtime(entry.modtime),
  };
}

/** RFC 3339 modtime (as Go writes it, with optional fraction) to seconds and nanoseconds. */
function mtime(modtime: string): { mtimeSec: number; mtimeNsec: number } {
  const ms = Date.parse(modtime);
  if (!Number.isFinite(ms)) return { mtimeSec: 0, mtimeNsec: 0 };
  const fraction = /\.(\d{1,9})/.exec(modtime)?.[1] ?? '';
  return { mtimeSec: Math.floor(ms / 1000), mtimeNsec: Number(fraction.padEnd(9, '0') || 0) };
}
