// The lazily mounted layers, by snapshot id: each is an eStargz blob read through the local peer
// (so through the swarm) and mounted with FUSE at the snapshot's `fs` dir. `RemoteLayers` serves
// them in the calling process; the snapshotter normally reaches it through a separate FUSE server
// process (fuse-server/) so that mounts, and the containers on them, outlive its restarts.
import fsp from 'node:fs/promises';
import type { Logger } from '../common/log.js';
import { detachMount, findMount, fuseMountHealth } from '../fuse/index.js';
import {
  FetchPriority,
  HttpRangeSource,
  mirrorBlobUrl,
  mountLazyLayer,
  type FetchPrioritySettings,
  type LazyLayer,
} from '../lazy/index.js';
import { LayersAhead, type BlobRef, type LayersAheadSettings } from './layers-ahead.js';
import type { RemoteSource } from './metadata.js';

export interface RemoteLayerSettings {
  /** The local peer's mirror, e.g. http://127.0.0.1:65001. */
  peer: string;
  prefetch: { enabled: boolean; size: number; warmFirstPiece: boolean; resolveAhead: boolean };
  backgroundFetch: { enabled: boolean; concurrency: number; idleMs: number };
  fuse: { attrTimeout: number; entryTimeout: number; maxReadahead?: number };
}

/** What a mounted layer reports (plain data: it crosses the FUSE server's socket). */
export interface MountedLayer {
  id: string;
  mountpoint: string;
  source: RemoteSource;
  size: number;
  stats: { sourceBytes: number; cacheHits: number; chunksFetched: number; digestMismatches: number; chunksMissing: number };
}

/** Who mounts remote layers for the snapshotter: in this process, or a FUSE server process. */
export interface LayerMounter {
  /** Mounts the layer unless it is already served alive; clears a stale mount first. */
  ensure(id: string, mountpoint: string, cacheDir: string, source: RemoteSource): Promise<void>;
  /** Fetches the footers, TOCs and prefetch ranges of layers containerd will prepare next (layers-ahead.ts); resolves when done. */
  resolveAhead(blobs: BlobRef[]): Promise<void>;
  /** Stops serving the layer and takes whatever is mounted at `mountpoint` away. */
  release(id: string, mountpoint: string): Promise<void>;
  /** The layers served alive. */
  layers(): Promise<MountedLayer[]>;
  /** The snapshotter stops: an in-process mounter unmounts everything, a FUSE server keeps serving. */
  close(): Promise<void>;
}

interface Served {
  layer: LazyLayer;
  blob: HttpRangeSource;
  source: RemoteSource;
}

export class RemoteLayers implements LayerMounter {
  private readonly served = new Map<string, Served>();
  /** Mounts under way, so two callers for one layer share one mount. */
  private readonly mounting = new Map<string, Promise<void>>();
  /** One for every layer served here: each layer's background fetch yields to the others' mounts and reads. */
  private readonly priority: FetchPriority;
  private readonly ahead: LayersAhead;

  constructor(
    private settings: RemoteLayerSettings,
    private readonly log: Logger,
  ) {
    this.priority = new FetchPriority(prioritySettings(settings));
    this.ahead = new LayersAhead(aheadSettings(settings), this.priority, log);
  }

  /** New settings apply to layers mounted from now on (the background fetch's slots and quiet period at once). */
  configure(settings: RemoteLayerSettings): void {
    this.settings = settings;
    this.priority.configure(prioritySettings(settings));
    this.ahead.configure(aheadSettings(settings));
  }

  async resolveAhead(blobs: BlobRef[]): Promise<void> {
    if (!this.settings.prefetch.resolveAhead) return;
    const mounted = new Set([...this.served.values()].map((s) => s.source.digest));
    await this.ahead.start(blobs, (digest) => mounted.has(digest));
  }

  /** Layers being mounted or served. */
  get busy(): boolean {
    return this.served.size > 0 || this.mounting.size > 0;
  }

  ensure(id: string, mountpoint: string, cacheDir: string, source: RemoteSource): Promise<void> {
    if (this.served.get(id)?.layer.alive) return Promise.resolve();
    let pending = this.mounting.get(id);
    if (!pending) {
      pending = this.mount(id, mountpoint, cacheDir, source).finally(() => this.mounting.delete(id));
      this.mounting.set(id, pending);
    }
    return pending;
  }

  /** Lazily: an overlay may still hold the mount. */
  async release(id: string, mountpoint: string): Promise<void> {
    await this.mounting.get(id)?.catch(() => {});
    const served = this.served.get(id);
    this.served.delete(id);
    if (served) {
      await served.layer.unmount({ lazy: true }).catch((error) => this.log.warn({ id, err: (error as Error).message }, 'unmount failed'));
      await served.blob.close();
    }
    await clearMount(mountpoint, this.log);
  }

  async layers(): Promise<MountedLayer[]> {
    return [...this.served]
      .filter(([, s]) => s.layer.alive)
      .map(([id, s]) => {
        const stats = s.layer.stats();
        return {
          id,
          mountpoint: s.layer.mountpoint,
          source: s.source,
          size: s.blob.size,
          stats: {
            sourceBytes: stats.sourceBytes ?? 0,
            cacheHits: stats.cacheHits,
            chunksFetched: stats.chunksFetched,
            digestMismatches: stats.digestMismatches,
            chunksMissing: stats.chunksMissing,
          },
        };
      });
  }

  close(): Promise<void> {
    return this.closeAll();
  }

  async closeAll(): Promise<void> {
    await this.ahead.close();
    for (const [id, served] of [...this.served]) await this.release(id, served.layer.mountpoint);
  }

  private async mount(id: string, mountpoint: string, cacheDir: string, source: RemoteSource): Promise<void> {
    await clearMount(mountpoint, this.log);
    const stale = this.served.get(id);
    if (stale) {
      this.served.delete(id);
      await stale.blob.close();
    }
    await fsp.mkdir(mountpoint, { recursive: true });
    const started = performance.now();
    // Resolved ahead (its TOC fetched while an earlier layer mounted): used if its TOC is the one the labels vouch for.
    let ahead = await this.ahead.take(source.digest);
    if (ahead && ahead.reader.tocDigest !== source.tocDigest) {
      this.log.warn(
        { digest: source.digest, tocDigest: ahead.reader.tocDigest, expected: source.tocDigest },
        'the TOC resolved ahead is not the one the labels name: read again',
      );
      await ahead.blob.close();
      ahead = undefined;
    }
    const url = mirrorBlobUrl(this.settings.peer, source.repository, source.digest, source.registry);
    const blob = ahead?.blob ?? (await HttpRangeSource.open(url, { checkedAgainstToc: true }));
    const headMs = Math.round(performance.now() - started);
    const log = this.log.child({ id, digest: source.digest });
    try {
      const { prefetch, backgroundFetch, fuse } = this.settings;
      const layer = await mountLazyLayer({
        source: blob,
        tocDigest: source.tocDigest,
        reader: ahead?.reader,
        mountpoint,
        cacheDir,
        prefetch: prefetch.enabled,
        prefetchSize: source.prefetchSize ?? prefetch.size,
        warmFirstPiece: prefetch.enabled && prefetch.warmFirstPiece,
        backgroundFetch,
        priority: this.priority,
        fuse: { attrTimeout: fuse.attrTimeout, entryTimeout: fuse.entryTimeout, maxReadahead: fuse.maxReadahead },
        onWarning: (message) => log.warn(message),
      });
      const served = { layer, blob, source };
      this.served.set(id, served);
      // Ended from outside (umount by someone, connection aborted): forget it; ensure() mounts again.
      void layer.closed.then(() => {
        if (this.served.get(id) === served) this.served.delete(id);
      });
      log.info(
        {
          mountpoint,
          size: blob.size,
          fetched: blob.counters.bytes,
          resolvedAhead: Boolean(ahead),
          timings: { headMs, ...layer.stats().timings },
        },
        'remote layer mounted',
      );
    } catch (error) {
      await blob.close();
      throw error;
    }
  }
}

function prioritySettings(settings: RemoteLayerSettings): FetchPrioritySettings {
  return { backgroundSlots: settings.backgroundFetch.concurrency, quietMs: settings.backgroundFetch.idleMs };
}

function aheadSettings(settings: RemoteLayerSettings): LayersAheadSettings {
  return { peer: settings.peer, prefetch: settings.prefetch.enabled, prefetchSize: settings.prefetch.size };
}

/**
 * Detaches whatever is mounted at `mountpoint` (all stacked mounts): typically a FUSE layer whose
 * server was killed ('dead': every access fails with ENOTCONN until it is gone).
 */
export async function clearMount(mountpoint: string, log: Logger): Promise<void> {
  for (let mount = await findMount(mountpoint); mount; mount = await findMount(mountpoint)) {
    const health = mount.fsType.startsWith('fuse') ? await fuseMountHealth(mountpoint) : 'not FUSE';
    log.info({ mountpoint, fsType: mount.fsType, health }, 'detaching a leftover mount');
    await detachMount(mountpoint);
  }
}
