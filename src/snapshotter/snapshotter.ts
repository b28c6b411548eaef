// containerd's Snapshotter semantics over the metadata store, the directory layout and the
// remote layers. Ordinary snapshots behave as containerd's overlay snapshotter; a Prepare whose
// labels describe an eStargz layer mounts it lazily, commits it under the target name and
// answers ALREADY_EXISTS, which tells containerd's unpacker to skip that layer's download.
import fsp from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from '../common/log.js';
import { listMounts } from '../fuse/index.js';
import { diskUsage, type Usage } from './disk-usage.js';
import { alreadyExists, SnapshotError } from './errors.js';
import { compileFilters } from './filters.js';
import { REMOTE_LABEL, REMOTE_LABEL_VALUE, remoteLayerFromLabels, TARGET_SNAPSHOT_LABEL, type RemoteLayerSpec } from './labels.js';
import type { Layout } from './layout.js';
import type { MetadataStore, RemoteSource, SnapshotKind, SnapshotRecord } from './metadata.js';
import { snapshotMounts, type Mount } from './mounts.js';
import { clearMount, type LayerMounter } from './remote-layers.js';

export interface SnapshotInfo {
  name: string;
  parent: string;
  kind: SnapshotKind;
  labels: Record<string, string>;
  created: Date;
  updated: Date;
}

const TEMP_PREFIX = 'new-';

export class Snapshotter {
  /** Temp dirs of creations under way: Cleanup must not take them. */
  private readonly creating = new Set<string>();

  constructor(
    private readonly layout: Layout,
    private readonly meta: MetadataStore,
    private readonly remote: LayerMounter,
    private readonly log: Logger,
  ) {}

  async prepare(key: string, parent: string, labels: Record<string, string>): Promise<Mount[]> {
    const spec = remoteLayerFromLabels(labels);
    if (typeof spec !== 'string' && this.meta.get(spec.target)) throw alreadyExists(`target snapshot ${spec.target}`);
    if (typeof spec !== 'string' && spec.nextLayers.length > 0) {
      const { registry, repository } = spec.image;
      const blobs = spec.nextLayers.map((digest) => ({ registry, repository, digest }));
      this.remote
        .resolveAhead(blobs)
        .catch((error: Error) => this.log.warn({ key, err: error.message }, 'could not resolve the next layers ahead'));
    }
    const record = await this.create(key, 'active', parent, labels);
    if (typeof spec === 'string') {
      if (!labels[TARGET_SNAPSHOT_LABEL]) this.log.debug({ key }, 'ordinary snapshot');
      else this.log.info({ key, reason: spec }, 'layer is not remote: ordinary snapshot');
    } else if (await this.mountRemote(key, record, spec)) {
      throw alreadyExists(`target snapshot ${spec.target}`);
    }
    return this.mountsOf(key, record);
  }

  async view(key: string, parent: string, labels: Record<string, string>): Promise<Mount[]> {
    return this.mountsOf(key, await this.create(key, 'view', parent, labels));
  }

  async mounts(key: string): Promise<Mount[]> {
    const record = this.meta.require(key);
    if (record.kind === 'committed') throw new SnapshotError('FAILED_PRECONDITION', `snapshot ${key} is committed: it has no mounts`);
    return this.mountsOf(key, record);
  }

  async commit(name: string, key: string, labels: Record<string, string>): Promise<void> {
    const record = this.meta.require(key);
    if (record.kind !== 'active') throw new SnapshotError('FAILED_PRECONDITION', `snapshot ${key} is not active`);
    const usage = await diskUsage(this.layout.upper(record.id));
    this.meta.commit(key, name, labels, { usage });
  }

  async remove(key: string): Promise<void> {
    const record = this.meta.remove(key);
    // The key is gone from the metadata: a failure below only leaves a directory for Cleanup.
    await this.removeDir(record.id).catch((error) =>
      this.log.warn({ key, err: (error as Error).message }, 'snapshot dir left for Cleanup'),
    );
  }

  stat(key: string): SnapshotInfo {
    return toInfo(key, this.meta.require(key));
  }

  /** Only labels are mutable: paths "labels" (all of them) or "labels.<key>"; none means all. */
  update(info: { name: string; labels: Record<string, string> }, paths: readonly string[]): SnapshotInfo {
    const record = this.meta.require(info.name);
    let labels = { ...record.labels };
    if (paths.length === 0) labels = { ...info.labels };
    for (const p of paths) {
      if (p === 'labels') labels = { ...info.labels };
      else if (p.startsWith('labels.')) {
        const k = p.slice('labels.'.length);
        if (info.labels[k] !== undefined && info.labels[k] !== '') labels[k] = info.labels[k];
        else delete labels[k];
      } else throw new SnapshotError('INVALID_ARGUMENT', `cannot update field "${p}" of snapshot ${info.name}`);
    }
    return toInfo(info.name, this.meta.setLabels(info.name, labels));
  }

  list(filters: readonly string[]): SnapshotInfo[] {
    const match = compileFilters(filters);
    return this.meta
      .entries()
      .map(([name, r]) => toInfo(name, r))
      .filter((i) => match(i));
  }

  async usage(key: string): Promise<Usage> {
    const record = this.meta.require(key);
    if (record.remote) return diskUsage(this.layout.cache(record.id)); // the chunk cache is its disk use
    if (record.kind === 'committed') return record.usage ?? { size: 0, inodes: 0 };
    return diskUsage(this.layout.upper(record.id));
  }

  /** Frees the directories (and mounts) of snapshots that no longer exist. */
  async cleanup(): Promise<void> {
    const known = this.meta.ids();
    for (const name of await fsp.readdir(this.layout.snapshots)) {
      if (known.has(name) || this.creating.has(name)) continue;
      await this.removeDir(name).catch((error) => this.log.warn({ dir: name, err: (error as Error).message }, 'cleanup failed'));
    }
  }

  /**
   * After a restart: takes away every mount left under snapshots/ that nobody serves any more
   * (its server was killed), keeps those the FUSE server still serves, then mounts the remote
   * layers the metadata holds. A layer that cannot be mounted now is tried again on use.
   */
  async restore(): Promise<void> {
    await fsp.mkdir(this.layout.snapshots, { recursive: true, mode: 0o700 });
    const served = new Set((await this.remote.layers()).map((layer) => layer.mountpoint));
    const leftovers = (await listMounts(this.layout.snapshots))
      .map((m) => m.mountpoint)
      .filter((mountpoint) => !served.has(mountpoint))
      .sort((a, b) => b.length - a.length);
    for (const mountpoint of leftovers) await clearMount(mountpoint, this.log);
    for (const [name, record] of this.meta.entries()) {
      if (!record.remote) continue;
      await this.ensureRemote(record.id, record.remote).catch((error) =>
        this.log.warn({ name, err: (error as Error).message }, 'remote layer not restored; retried on use'),
      );
    }
  }

  async close(): Promise<void> {
    await this.remote.close();
  }

  private async create(key: string, kind: 'active' | 'view', parent: string, labels: Record<string, string>): Promise<SnapshotRecord> {
    // Built under a temporary name and renamed once recorded: a crash leaves only a new-* dir for Cleanup.
    const temp = await fsp.mkdtemp(path.join(this.layout.snapshots, TEMP_PREFIX));
    this.creating.add(path.basename(temp));
    try {
      await fsp.mkdir(path.join(temp, 'fs'), { mode: 0o755 });
      if (kind === 'active') await fsp.mkdir(path.join(temp, 'work'), { mode: 0o711 });
      const record = this.meta.create(key, kind, parent, labels);
      await fsp.rename(temp, this.layout.dir(record.id));
      return record;
    } catch (error) {
      await fsp.rm(temp, { recursive: true, force: true });
      throw error;
    } finally {
      this.creating.delete(path.basename(temp));
    }
  }

  /** True when the layer is mounted and committed as `spec.target`; false means: unpack it normally. */
  private async mountRemote(key: string, record: SnapshotRecord, spec: RemoteLayerSpec): Promise<boolean> {
    const source = {
      registry: spec.image.registry,
      repository: spec.image.repository,
      digest: spec.digest,
      tocDigest: spec.tocDigest,
      prefetchSize: spec.prefetchSize,
    };
    const started = Date.now();
    try {
      await this.ensureRemote(record.id, source);
    } catch (error) {
      this.log.warn({ key, digest: spec.digest, err: (error as Error).message }, 'remote mount failed: ordinary snapshot');
      return false;
    }
    try {
      this.meta.commit(key, spec.target, { [REMOTE_LABEL]: REMOTE_LABEL_VALUE }, { remote: source, usage: { size: 0, inodes: 0 } });
    } catch (error) {
      // Someone committed the target meanwhile: theirs stands, ours goes.
      await this.remote.release(record.id, this.layout.upper(record.id));
      if (error instanceof SnapshotError && error.code === 'ALREADY_EXISTS') {
        await this.remove(key);
        return true;
      }
      throw error;
    }
    this.log.info({ target: spec.target, digest: spec.digest, ms: Date.now() - started }, 'remote snapshot prepared');
    return true;
  }

  private ensureRemote(id: string, remote: RemoteSource): Promise<void> {
    return this.remote.ensure(id, this.layout.upper(id), this.layout.cache(id), remote);
  }

  /** Mounts for a snapshot; remote layers below it are mounted again first if they are not alive. */
  private async mountsOf(key: string, record: SnapshotRecord): Promise<Mount[]> {
    const chain = this.meta.parentChain(key);
    for (const [name, parent] of chain) {
      if (!parent.remote) continue;
      try {
        await this.ensureRemote(parent.id, parent.remote);
      } catch (error) {
        throw new SnapshotError('UNAVAILABLE', `layer ${name} unavailable: ${(error as Error).message}`);
      }
    }
    return snapshotMounts(
      this.layout,
      record.id,
      record.kind,
      chain.map(([, p]) => p.id),
    );
  }

  private async removeDir(id: string): Promise<void> {
    const dir = this.layout.dir(id);
    await this.remote.release(id, this.layout.upper(id));
    // Never let rm walk into a mount (an upper dir someone bind-mounted, a FUSE layer).
    for (const m of (await listMounts(dir)).sort((a, b) => b.mountpoint.length - a.mountpoint.length))
      await clearMount(m.mountpoint, this.log);
    await fsp.rm(dir, { recursive: true, force: true });
  }
}

function toInfo(name: string, r: SnapshotRecord): SnapshotInfo {
  return {
    name,
    parent: r.parent ?? '',
    kind: r.kind,
    labels: { ...r.labels },
    created: new Date(r.created),
    updated: new Date(r.updated),
  };
}
