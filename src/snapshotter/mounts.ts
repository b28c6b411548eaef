// The mounts containerd gets for a snapshot, as containerd's overlay snapshotter builds them:
// no parent → a bind mount of the snapshot's own dir; a view on one parent → a read-only bind
// of it; otherwise overlay with lowerdir= the parents' dirs, nearest first (for remote layers
// those dirs are FUSE mountpoints, so the container's overlay stacks the lazy layers).
import type { Layout } from './layout.js';
import type { SnapshotKind } from './metadata.js';

export interface Mount {
  type: string;
  source: string;
  target: string;
  options: string[];
}

export function snapshotMounts(layout: Layout, id: string, kind: SnapshotKind, parentIds: readonly string[]): Mount[] {
  if (parentIds.length === 0) {
    return [{ type: 'bind', source: layout.upper(id), target: '', options: [kind === 'view' ? 'ro' : 'rw', 'rbind'] }];
  }
  const [only, ...others] = parentIds;
  if (kind !== 'active' && only !== undefined && others.length === 0) {
    return [{ type: 'bind', source: layout.upper(only), target: '', options: ['ro', 'rbind'] }];
  }
  const options: string[] = [];
  if (kind === 'active') options.push(`workdir=${layout.work(id)}`, `upperdir=${layout.upper(id)}`);
  options.push(`lowerdir=${parentIds.map((p) => layout.upper(p)).join(':')}`);
  return [{ type: 'overlay', source: 'overlay', target: '', options }];
}
