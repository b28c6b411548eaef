// mountLazyLayer: an eStargz layer as a read-only FUSE file system whose file data is fetched
// on first read. Opening costs the footer and the TOC; the prioritized files (before the
// `.prefetch.landmark`) come in one Range request before the layer is reported ready.
import fsp from 'node:fs/promises';
import { EstargzError, openEstargz, type EstargzReader, type RangeSource } from '../estargz/index.js';
import { mountFuse, type FuseExit, type FuseMount, type FuseOptions } from '../fuse/index.js';
import { BackgroundFetcher, type BackgroundFetchOptions, type BackgroundProgress } from './background.js';
import { ChunkFetcher, type FetchStats } from './chunk-fetcher.js';
import { ChunkStore, type ChunkMemoryCache } from './chunk-store.js';
import { FetchPriority } from './fetch-priority.js';
import type { StreamingRangeSource } from './http-source.js';
import { layerOps } from './layer-ops.js';
import { LayerTree, type WhiteoutMode } from './layer-tree.js';
import { prefetch, prefetchLength, type PrefetchResult } from './prefetch.js';

export interface LazyLayerOptions {
  /** The blob (an HttpRangeSource through the peer, or any RangeSource). */
  source: RangeSource;
  /** The layer's `containerd.io/snapshot/stargz/toc.digest`: the TOC must hash to it. */
  tocDigest: string;
  /** The blob already opened on `source` (footer and TOC read ahead of the mount); its TOC must hash to tocDigest. */
  reader?: EstargzReader;
  /** An existing, empty directory. */
  mountpoint: string;
  /** Chunk cache (may be shared by many layers). */
  cacheDir: string;
  /** Fetch [0, landmark) before resolving (default true). */
  prefetch?: boolean;
  /** Bytes to prefetch when the layer has no landmark at all (stargz-snapshotter's prefetch_size; default 0). */
  prefetchSize?: number;
  /**
   * Read the blob's first byte while the footer and the TOC are fetched (default false). Through a
   * Starling peer this starts the fetch of the blob's first piece, where an optimized layer keeps
   * its prioritized files, so that it overlaps the TOC's round trips and parsing instead of
   * following them; the prefetch then finds those bytes at the peer. A layer that needs nothing
   * from there costs that piece.
   */
  warmFirstPiece?: boolean;
  backgroundFetch?: BackgroundFetchOptions;
  /**
   * Shared by every layer of a node (the snapshotter's FUSE server passes one): the mount, its
   * prefetch and on-demand fetches count as on-demand work, which background fetches of all those
   * layers yield to. Default: one for this layer alone, from backgroundFetch's concurrency and idleMs.
   */
  priority?: FetchPriority;
  /** How `.wh.` entries appear (default 'overlayfs', as stargz-snapshotter). */
  whiteouts?: WhiteoutMode;
  /** xattrs marking opaque directories (default trusted.overlay.opaque). */
  opaqueXattrs?: string[];
  /** FUSE settings; defaults suit an immutable layer (long timeouts, page cache kept). */
  fuse?: FuseOptions;
  /**
   * Kernel read-ahead for the mount, in KiB (default 4096; 0 leaves the kernel's 128). FUSE lets a
   * server only lower read-ahead when it starts, so it is raised afterwards through the mount's
   * /sys/class/bdi/<dev>/read_ahead_kb (needs root; on failure the default stays, with a warning).
   * With more read-ahead, sequential reads come as 1 MiB requests, several in flight, instead of
   * 128 KiB ones one after the other; a chunk is fetched whole anyway, so it costs no extra fetching
   * within a chunk.
   */
  readAheadKib?: number;
  /**
   * Whole chunks kept in memory for repeated and sequential reads (default: the process's shared
   * 64 MiB cache, sharedChunkMemory); null for none.
   */
  chunkMemory?: ChunkMemoryCache | null;
  /** Problems that did not stop the mount (failed prefetch or background chunks, read errors). */
  onWarning?: (message: string, error?: unknown) => void;
  /**
   * Called with the TOC name of a regular file each time it is opened through the mount (exec
   * and mmap included; a hardlink reports the entry holding the data). For recording what a
   * workload reads; it runs on the FUSE dispatch path, so keep it cheap. Errors it throws are
   * reported through onWarning and do not fail the open.
   */
  onAccess?: (path: string) => void;
}

/** Milliseconds each step of the mount took (for logs: where a slow start went). */
export interface MountTimings {
  /** Footer and TOC fetched, TOC checked and indexed. */
  openMs: number;
  /** The prefetch request, from its start to its last chunk stored (overlaps treeMs). */
  prefetchMs: number;
  /** The file tree built from the TOC. */
  treeMs: number;
  /** The FUSE session started and read-ahead set. */
  fuseMs: number;
}

export interface LazyLayerStats extends FetchStats {
  /** Bytes received by the source, including footer and TOC (when the source counts them). */
  sourceBytes?: number;
  /** Distinct chunks of the layer not in the cache yet: 0 once the node holds the whole layer. */
  chunksMissing: number;
  sourceRequests?: number;
  prefetch: PrefetchResult;
  background?: BackgroundProgress;
  timings: MountTimings;
}

export interface LazyLayer {
  readonly mountpoint: string;
  readonly tocDigest: string;
  readonly cacheDir: string;
  readonly reader: EstargzReader;
  readonly tree: LayerTree;
  readonly alive: boolean;
  /** Resolves when the FUSE session ends. */
  readonly closed: Promise<FuseExit>;
  /** When background fetch is enabled: resolves once every chunk has been tried. */
  readonly backgroundDone?: Promise<void>;
  stats(): LazyLayerStats;
  /** Unmounts (see FuseMount.unmount for `lazy` and EBUSY), then stops background work and closes the cache. */
  unmount(options?: { lazy?: boolean }): Promise<void>;
}

const DEFAULT_READ_AHEAD_KIB = 4096;

const IMMUTABLE_FUSE_DEFAULTS: FuseOptions = {
  fsName: 'starling',
  subtype: 'starling',
  entryTimeout: 60,
  attrTimeout: 60,
  keepCache: true,
};

export async function mountLazyLayer(options: LazyLayerOptions): Promise<LazyLayer> {
  const priority =
    options.priority ??
    new FetchPriority({ backgroundSlots: options.backgroundFetch?.concurrency ?? 2, quietMs: options.backgroundFetch?.idleMs ?? 100 });
  // Until the prefetch is in, the mount is on-demand work: no background fetch (of any layer) competes with it.
  const endDemand = priority.beginDemand();
  try {
    return await mountWith(options, priority);
  } finally {
    endDemand();
  }
}

async function mountWith(options: LazyLayerOptions, priority: FetchPriority): Promise<LazyLayer> {
  const warn = options.onWarning ?? (() => {});
  const since = (start: number) => Math.round(performance.now() - start);
  const timings: MountTimings = { openMs: 0, prefetchMs: 0, treeMs: 0, fuseMs: 0 };
  let step = performance.now();
  // The cache directory is scanned while the footer and TOC are fetched.
  const opening = ChunkStore.open(options.cacheDir, { memory: options.chunkMemory });
  opening.catch(() => {});
  // A hint: its failure changes nothing (the prefetch asks again and reports its own errors).
  if (options.warmFirstPiece && !options.reader && options.source.size > 0) options.source.read(0, 1).catch(() => {});
  let reader: EstargzReader;
  try {
    if (options.reader && options.reader.tocDigest !== options.tocDigest) {
      throw new EstargzError(
        'TOC_DIGEST',
        `TOC digest mismatch: the blob's TOC is ${options.reader.tocDigest}, expected ${options.tocDigest}`,
      );
    }
    reader = options.reader ?? (await openEstargz(options.source, { tocDigest: options.tocDigest }));
  } catch (error) {
    await opening.then(
      (s) => s.close(),
      () => {},
    );
    throw error;
  }
  timings.openMs = since(step);
  const store = await opening;
  const fetcher = new ChunkFetcher(options.source, store, reader.format, { priority });

  // The prefetch request goes out first; the file tree is built while its bytes arrive.
  const prefetching = (async (): Promise<PrefetchResult> => {
    const none: PrefetchResult = { length: 0, chunks: 0, failed: [] };
    if (!(options.prefetch ?? true)) return none;
    const length = prefetchLength(reader, options.prefetchSize);
    const started = performance.now();
    try {
      const result = await prefetch(reader, streaming(options.source), fetcher, length);
      timings.prefetchMs = since(started);
      for (const error of result.failed) warn(`prefetch: ${error.message}`, error);
      return result;
    } catch (error) {
      // The layer still works without its prefetch: each file is fetched on first read.
      warn(`prefetch of [0, ${length}) failed: ${(error as Error).message}`, error);
      return none;
    }
  })();
  let tree: LayerTree;
  try {
    await new Promise((resolve) => setImmediate(resolve)); // let the request be sent before the CPU work
    step = performance.now();
    tree = new LayerTree(reader, { whiteouts: options.whiteouts, opaqueXattrs: options.opaqueXattrs });
    timings.treeMs = since(step);
  } catch (error) {
    await prefetching;
    await store.close();
    throw error;
  }
  const prefetched = await prefetching;

  step = performance.now();
  let mount: FuseMount;
  try {
    const onAccess = options.onAccess;
    const hooks = onAccess
      ? {
          onAccess: (path: string) => {
            try {
              onAccess(path);
            } catch (error) {
              warn(`onAccess(${path}): ${(error as Error).message}`, error);
            }
          },
        }
      : {};
    mount = await mountFuse(options.mountpoint, layerOps(tree, fetcher, hooks), {
      ...IMMUTABLE_FUSE_DEFAULTS,
      ...options.fuse,
      onError: (error, op) => {
        warn(`${op}: ${(error as Error).message}`, error);
        options.fuse?.onError?.(error, op);
      },
    });
  } catch (error) {
    await store.close();
    throw error;
  }

  const readAheadKib = options.readAheadKib ?? DEFAULT_READ_AHEAD_KIB;
  if (readAheadKib > 0) {
    await setReadAhead(mount.mountpoint, readAheadKib).catch((error: Error) =>
      warn(`read-ahead stays at the kernel's default: ${error.message}`, error),
    );
  }

  timings.fuseMs = since(step);

  const background = options.backgroundFetch?.enabled
    ? new BackgroundFetcher(reader.chunks, fetcher, options.backgroundFetch, (error) =>
        warn(`background fetch: ${(error as Error).message}`, error),
      )
    : undefined;

  const counters = (options.source as { counters?: { bytes: number; requests: number } }).counters;
  const chunkDigests = [...new Set(reader.chunks.map((chunk) => chunk.digest))];
  let chunksMissing = chunkDigests;
  return {
    mountpoint: mount.mountpoint,
    tocDigest: reader.tocDigest,
    cacheDir: store.dir,
    reader,
    tree,
    get alive() {
      return mount.alive;
    },
    closed: mount.closed,
    backgroundDone: background?.finished,
    stats: () => ({
      ...fetcher.stats,
      sourceBytes: counters?.bytes,
      // Only shrinks (the cache never drops a chunk of a mounted layer): recount what was missing.
      chunksMissing: (chunksMissing = chunksMissing.filter((digest) => !store.has(digest))).length,
      sourceRequests: counters?.requests,
      prefetch: prefetched,
      background: background ? { ...background.progress } : undefined,
      timings,
    }),
    async unmount(opts = {}) {
      await mount.unmount(opts); // EBUSY leaves everything running
      background?.stop();
      await background?.finished;
      // A lazy unmount keeps serving open files: the cache stays open until the session ends.
      if (opts.lazy) void mount.closed.then(() => store.close());
      else await store.close();
    },
  };
}

/** The source's own stream() when it has one (one request); else one read of the whole range. */
function streaming(source: RangeSource): StreamingRangeSource {
  if (typeof (source as Partial<StreamingRangeSource>).stream === 'function') return source as StreamingRangeSource;
  return {
    size: source.size,
    read: (offset, length, priority) => source.read(offset, length, priority),
    async *stream(offset, length) {
      yield await source.read(offset, length);
    },
  };
}

/** Sets the read-ahead of the mount at `mountpoint` (its bdi is named after the device, major:minor). */
export async function setReadAhead(mountpoint: string, kib: number): Promise<void> {
  // mountinfo, not stat(): a stat of our own mount would be answered by this very thread.
  const info = await fsp.readFile('/proc/self/mountinfo', 'utf8');
  const unescape = (p: string) => p.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(parseInt(octal, 8)));
  const fields = info
    .split('\n')
    .map((line) => line.split(' '))
    .filter((f) => f[4] !== undefined && unescape(f[4]) === mountpoint)
    .pop();
  const device = fields?.[2];
  if (!device || !/^\d+:\d+$/.test(device)) throw new Error(`${mountpoint} is not in /proc/self/mountinfo`);
  await fsp.writeFile(`/sys/class/bdi/${device}/read_ahead_kb`, String(Math.round(kib)));
}
