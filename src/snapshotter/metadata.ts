// The snapshotter's metadata: every snapshot by key (or committed name), kept in one JSON file
// under the root and replaced atomically (temp file, fsync, rename) on each change, so a crash
// leaves either the old or the new state, never half of one. Small: one record per layer or
// container, so whole-file writes are cheap.
import fs from 'node:fs';
import path from 'node:path';
import { alreadyExists, notFound, SnapshotError } from './errors.js';

export type SnapshotKind = 'active' | 'view' | 'committed';

/** Where a lazily mounted layer comes from (kept so a restart can mount it again). */
export interface RemoteSource {
  registry: string;
  repository: string;
  digest: string;
  tocDigest: string;
  prefetchSize?: number;
}

export interface SnapshotRecord {
  /** Names the directory snapshots/<id>; never reused. */
  id: string;
  kind: SnapshotKind;
  parent?: string;
  labels: Record<string, string>;
  created: string;
  updated: string;
  /** Disk use measured at commit. */
  usage?: { size: number; inodes: number };
  remote?: RemoteSource;
}

interface StoreFile {
  version: 1;
  nextId: number;
  snapshots: Record<string, SnapshotRecord>;
}

export class MetadataStore {
  private constructor(
    private readonly file: string,
    private state: StoreFile,
  ) {}

  static open(file: string): MetadataStore {
    let state: StoreFile = { version: 1, nextId: 1, snapshots: {} };
    try {
      state = JSON.parse(fs.readFileSync(file, 'utf8')) as StoreFile;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw new Error(`snapshot metadata ${file}: ${(error as Error).message}`);
    }
    if (state.version !== 1 || typeof state.snapshots !== 'object') throw new Error(`snapshot metadata ${file}: unknown format`);
    return new MetadataStore(file, state);
  }

  get(key: string): SnapshotRecord | undefined {
    return this.state.snapshots[key];
  }

  require(key: string): SnapshotRecord {
    const record = this.get(key);
    if (!record) throw notFound(`snapshot ${key}`);
    return record;
  }

  entries(): Array<[string, SnapshotRecord]> {
    return Object.entries(this.state.snapshots);
  }

  ids(): Set<string> {
    return new Set(Object.values(this.state.snapshots).map((s) => s.id));
  }

  /** The chain below `key`, immediate parent first. */
  parentChain(key: string): Array<[string, SnapshotRecord]> {
    const chain: Array<[string, SnapshotRecord]> = [];
    for (let name = this.require(key).parent; name; name = this.require(name).parent) chain.push([name, this.require(name)]);
    return chain;
  }

  hasChildren(key: string): boolean {
    return Object.values(this.state.snapshots).some((s) => s.parent === key);
  }

  /** Adds an active or view snapshot on a committed parent. */
  create(key: string, kind: 'active' | 'view', parent: string | undefined, labels: Record<string, string>): SnapshotRecord {
    if (!key) throw new SnapshotError('INVALID_ARGUMENT', 'snapshot key must not be empty');
    if (this.get(key)) throw alreadyExists(`snapshot ${key}`);
    if (parent) {
      const p = this.get(parent);
      if (!p) throw notFound(`parent snapshot ${parent}`);
      if (p.kind !== 'committed') throw new SnapshotError('INVALID_ARGUMENT', `parent ${parent} is not a committed snapshot`);
    }
    const now = new Date().toISOString();
    const record: SnapshotRecord = {
      id: String(this.state.nextId++),
      kind,
      parent: parent || undefined,
      labels: { ...labels },
      created: now,
      updated: now,
    };
    this.state.snapshots[key] = record;
    this.save();
    return record;
  }

  /** Renames active `key` to committed `name`. */
  commit(key: string, name: string, labels: Record<string, string>, extra: Pick<SnapshotRecord, 'usage' | 'remote'>): SnapshotRecord {
    const record = this.require(key);
    if (record.kind !== 'active') throw new SnapshotError('FAILED_PRECONDITION', `snapshot ${key} is not active`);
    if (this.get(name)) throw alreadyExists(`snapshot ${name}`);
    const now = new Date().toISOString();
    const committed: SnapshotRecord = { ...record, ...extra, kind: 'committed', labels: { ...record.labels, ...labels }, updated: now };
    delete this.state.snapshots[key];
    this.state.snapshots[name] = committed;
    this.save();
    return committed;
  }

  remove(key: string): SnapshotRecord {
    const record = this.require(key);
    if (this.hasChildren(key)) throw new SnapshotError('FAILED_PRECONDITION', `snapshot ${key} has children`);
    delete this.state.snapshots[key];
    this.save();
    return record;
  }

  setLabels(key: string, labels: Record<string, string>): SnapshotRecord {
    const record = this.require(key);
    record.labels = labels;
    record.updated = new Date().toISOString();
    this.save();
    return record;
  }

  private save(): void {
    const tmp = `${this.file}.${process.pid}.tmp`;
    const fd = fs.openSync(tmp, 'w', 0o600);
    try {
      fs.writeFileSync(fd, JSON.stringify(this.state));
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    fs.renameSync(tmp, this.file);
    const dir = fs.openSync(path.dirname(this.file), 'r');
    try {
      fs.fsyncSync(dir);
    } finally {
      fs.closeSync(dir);
    }
  }
}
