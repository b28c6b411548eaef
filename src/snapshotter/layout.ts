// Where a snapshot's files live: <root>/snapshots/<id>/{fs,work,cache}. `fs` is the overlay
// upper dir of an ordinary snapshot, or the FUSE mountpoint of a remote layer; `cache` holds a
// remote layer's verified chunks (removed with the snapshot, so Remove frees its disk).
import path from 'node:path';

export class Layout {
  readonly snapshots: string;
  readonly metadataFile: string;

  constructor(readonly root: string) {
    this.snapshots = path.join(root, 'snapshots');
    this.metadataFile = path.join(root, 'metadata.json');
  }

  dir(id: string): string {
    return path.join(this.snapshots, id);
  }
  upper(id: string): string {
    return path.join(this.snapshots, id, 'fs');
  }
  work(id: string): string {
    return path.join(this.snapshots, id, 'work');
  }
  cache(id: string): string {
    return path.join(this.snapshots, id, 'cache');
  }
}
