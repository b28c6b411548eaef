// Layers resolved ahead of their mount. containerd prepares an image's layers one after the other,
// and each lazy mount waits for its footer, TOC and prefetch range; the labels of the first layer
// already name the later ones (`containerd.io/snapshot/remote/stargz.layers`), so their footers,
// TOCs and prefetch ranges are fetched through the peer at once, in parallel with the first mount:
// the node's link then carries all of them together instead of one layer's after the other's, and
// later mounts find their bytes at the local peer. stargz-snapshotter does the same (fs.Mount
// resolves the "neighboring layers" and prefetches them).
//
// Nothing fetched ahead is trusted: the TOC is parsed without knowing its digest, and is used for a
// mount only if it hashes to the digest the mount's own labels give; the prefetch range is read
// through the peer and dropped — the mount reads it again from the peer, and checks each chunk.
import type { Logger } from '../common/log.js';
import { openEstargz, type EstargzReader } from '../estargz/index.js';
import { HttpRangeSource, mirrorBlobUrl, prefetchLength, type FetchPriority } from '../lazy/index.js';

/** A blob of the image named by a layer's labels. */
export interface BlobRef {
  registry: string;
  repository: string;
  digest: string;
}

export interface ResolvedLayer {
  blob: HttpRangeSource;
  /** Opened without a digest to check: compare reader.tocDigest with the mount's before using it. */
  reader: EstargzReader;
}

export interface LayersAheadSettings {
  /** The local peer's mirror. */
  peer: string;
  /** Read the prefetch range ahead too (the prefetch is on). */
  prefetch: boolean;
  /** Bytes to prefetch from a layer without landmark. */
  prefetchSize: number;
}

/** Layers resolved ahead and not mounted after this long are forgotten (their image is not being pulled). */
const KEEP_MS = 10 * 60_000;
/** At most this many kept at once (each holds a parsed TOC). */
const MAX_KEPT = 64;

interface Entry {
  resolved: Promise<ResolvedLayer | undefined>;
  expiry: NodeJS.Timeout;
}

export class LayersAhead {
  private readonly entries = new Map<string, Entry>();

  constructor(
    private settings: LayersAheadSettings,
    private readonly priority: FetchPriority,
    private readonly log: Logger,
  ) {}

  configure(settings: LayersAheadSettings): void {
    this.settings = settings;
  }

  /**
   * Starts resolving the blobs not resolved or being resolved yet (`skip`: those mounted already);
   * resolves when those it started are resolved (or failed: a failure only means the mount reads them itself).
   */
  async start(blobs: readonly BlobRef[], skip: (digest: string) => boolean): Promise<void> {
    const started: Array<Promise<unknown>> = [];
    for (const ref of blobs) {
      if (this.entries.has(ref.digest) || skip(ref.digest) || this.entries.size >= MAX_KEPT) continue;
      const resolved = this.priority
        .demand(() => this.resolve(ref))
        .catch((error: Error) => {
          this.log.debug({ digest: ref.digest, err: error.message }, 'layer not resolved ahead');
          return undefined;
        });
      const expiry = setTimeout(() => void this.drop(ref.digest), KEEP_MS);
      expiry.unref();
      this.entries.set(ref.digest, { resolved, expiry });
      started.push(resolved);
    }
    await Promise.all(started);
  }

  /** The blob resolved ahead, if it was (the caller owns it from now on: close its blob). */
  async take(digest: string): Promise<ResolvedLayer | undefined> {
    const entry = this.entries.get(digest);
    if (!entry) return undefined;
    this.entries.delete(digest);
    clearTimeout(entry.expiry);
    return entry.resolved;
  }

  async close(): Promise<void> {
    await Promise.all([...this.entries.keys()].map((digest) => this.drop(digest)));
  }

  private async drop(digest: string): Promise<void> {
    const resolved = await this.take(digest);
    await resolved?.blob.close();
  }

  private async resolve(ref: BlobRef): Promise<ResolvedLayer> {
    const started = performance.now();
    const url = mirrorBlobUrl(this.settings.peer, ref.repository, ref.digest, ref.registry);
    const blob = await HttpRangeSource.open(url, { checkedAgainstToc: true });
    try {
      const reader = await openEstargz(blob);
      const length = this.settings.prefetch ? prefetchLength(reader, this.settings.prefetchSize) : 0;
      if (length > 0) {
        // Through a source of its own, so that the mount's counters show only what the mount read.
        const warm = await HttpRangeSource.open(url, { checkedAgainstToc: true });
        try {
          for await (const _ of warm.stream(0, length));
        } finally {
          await warm.close();
        }
      }
      this.log.info({ digest: ref.digest, prefetched: length, ms: Math.round(performance.now() - started) }, 'layer resolved ahead');
      return { blob, reader };
    } catch (error) {
      await blob.close();
      throw error;
    }
  }
}
