import { hostname } from 'node:os';
import { Agent } from 'undici';
import type { Logger } from '../../common/log.js';
import { clientTlsOptions } from '../../common/tls.js';
import type { RateLimiter } from '../../common/rate-limiter.js';
import { parseBlobUrl } from '../../oci/blob-url.js';
import type { RegistryTransport } from '../../oci/transport.js';
import type { HostInfo } from '../../rpc/scheduler-api.js';
import type { BlobFetchRequest, FetchStatus, PieceSpan, PieceWish } from '../../rpc/upload-api.js';
import { pieceBounds, pieceSizeFor, type PieceLayout } from '../../storage/piece-plan.js';
import { readableAnonymously } from '../access/checker.js';
import type { BlobTask } from '../blob-task.js';
import { PieceSpans, type SpanView } from '../piece-spans.js';
import { OriginSource, type OriginReadCounts } from '../sources/origin-source.js';
import type { PieceProvenance, PieceRun, PieceSink, PieceSource } from '../sources/piece-source.js';
import type { TaskManager } from '../task-manager.js';
import { keepaliveFromHost, ManagerClient } from './manager-client.js';
import { SchedulerClient } from './scheduler-client.js';
import { putsBackgroundOff } from './policy/background-put-off.js';
import { SwarmDownload, type SwarmSettings } from './swarm-download.js';

export interface SwarmOptions extends SwarmSettings {
  schedulers: string[];
  /** The manager that hands out schedulers (and sends preheats); optional. */
  manager?: { url: URL; mirrorUrl: string };
  advertiseIp: string;
  uploadPort: number;
  seed: boolean;
  labels: Record<string, string>;
  uploadSlots: number;
  uploadBandwidth: number;
  uploadSlotsInUse: () => number;
  /** Counts this peer's reads of origin registries (the peer's metrics). */
  originCounts?: OriginReadCounts;
}

/** The default host id: unique per peer daemon even when several share one machine. */
export function defaultHostId(ip: string, port: number): string {
  return `${hostname()}-${ip}-${port}`;
}

/**
 * The peer's membership in the swarm: announces the host, keeps one SwarmDownload per task,
 * and answers seed triggers. Blob requests get their pieces through `sourceFor`.
 */
export class Swarm {
  private readonly downloads = new Map<string, SwarmDownload>();
  /** Parts of pieces read for lazy readers, here and downstream (piece-spans.ts). */
  private readonly spans = new PieceSpans();
  private readonly schedulers: SchedulerClient;
  private readonly dispatcher: Agent;

  constructor(
    private readonly options: SwarmOptions,
    private readonly tasks: TaskManager,
    private readonly transport: RegistryTransport,
    private readonly downloadLimiter: RateLimiter,
    private readonly log: Logger,
  ) {
    this.schedulers = new SchedulerClient(options.schedulers, options.clusterToken, options.tls, log);
    this.dispatcher = new Agent({
      connections: 16,
      keepAliveTimeout: 30_000,
      headersTimeout: 30_000,
      bodyTimeout: 60_000,
      ...(options.tls ? { connect: clientTlsOptions(options.tls) } : {}),
    });
  }

  private managerClient?: ManagerClient;

  /** Set once the blobs kept from before a restart have been offered. */
  private started = false;
  /** Set when close() begins: no new task joins the swarm (a blob verified meanwhile is not announced). */
  private closing = false;

  async start(): Promise<void> {
    const manager = this.options.manager;
    if (manager) {
      this.managerClient = new ManagerClient(manager.url, this.options.clusterToken, this.options.tls, this.log);
      await this.managerClient.start(
        () =>
          keepaliveFromHost(
            this.hostInfo(),
            manager.mirrorUrl,
            this.tasks
              .list()
              .map((task) => ({ digest: task.digest, size: task.size, complete: task.complete, bytesFrom: { ...task.bytesBySource } })),
          ),
        (addresses) => {
          // Flags name schedulers too; the manager's list comes on top of them.
          const all = [...new Set([...this.options.schedulers, ...addresses])];
          if (all.join(',') !== this.schedulers.addresses.join(',')) {
            this.log.info({ schedulers: all }, 'schedulers from the manager');
            this.schedulers.setAddresses(all);
          }
        },
      );
    }
    await this.schedulers.startAnnouncing(() => this.hostInfo());
    // Blobs kept from before a restart are offered to the swarm again, including those whose
    // verification the restart cut short (their task verifies them on load: wait for it).
    const verifying = this.tasks.list().filter((task) => !task.complete && task.blob.storedPieceCount === task.layout.pieceCount);
    await Promise.all(verifying.map((task) => task.whenPersisted().catch(() => undefined)));
    for (const task of this.tasks.list()) if (task.complete) this.downloadFor(task).announceHolding();
    this.started = true;
  }

  hostInfo(): HostInfo {
    return {
      id: this.options.hostId,
      hostname: hostname(),
      ip: this.options.advertiseIp,
      uploadPort: this.options.uploadPort,
      labels: this.options.labels,
      seed: this.options.seed,
      uploadBandwidth: this.options.uploadBandwidth,
      uploadSlots: this.options.uploadSlots,
      uploadInUse: this.options.uploadSlotsInUse(),
    };
  }

  /** A piece source that fetches through the swarm, reading the origin with `origin` if it must. */
  sourceFor(task: BlobTask, origin: OriginSource): PieceSource {
    // A private blob's pieces cross the upload port only with its client's credentials beside
    // them, which travel over TLS only: without TLS, every peer reads a private blob itself.
    if (!this.options.tls && !task.blob.sources[0]?.public) return origin;
    const download = () => this.downloadFor(task);
    return {
      kind: 'peer',
      description: 'swarm',
      fetchRun: async (layout: PieceLayout, run: PieceRun, sink: PieceSink) => {
        // Shutting down: the scheduler is being left, so the last reads go to the origin.
        if (this.closing) return origin.fetchRun(layout, run, sink);
        const swarmDownload = download();
        swarmDownload.want(run, origin);
        await swarmDownload.waitRun(run);
      },
    };
  }

  /**
   * Part of piece `index` for a reader that checks it against a verified TOC, or for a child
   * passing such a read on (`hops`: peers it passed through): a span kept or arriving here, else
   * read once — from the origin when this peer reads the task for the swarm, else from its
   * parents. Undefined when this peer reads no spans of the task (a private blob, a peer leaving).
   * `origin` is how the asking client would read the blob, for a peer not yet in the task's swarm.
   */
  span(task: BlobTask, index: number, span: PieceSpan, hops: number, origin?: OriginSource): SpanView | undefined {
    if (this.closing || !task.blob.sources[0]?.public) return undefined;
    const seeded = this.onDemand.get(task.digest);
    if (!seeded && !origin && !this.relaySource(task.digest)) return this.spans.find(task.digest, index, span);
    return this.spans.open(task.digest, index, span, async (into) => {
      try {
        if (seeded) {
          const { offset } = pieceBounds(task.layout, index);
          await seeded.origin.readRange(offset + span.start, offset + span.end, into);
        } else {
          await this.downloadFor(task).readSpan(index, span, hops, into, origin);
        }
      } catch (error) {
        this.log.debug({ task: task.digest, index, span, err: (error as Error).message }, 'span not read');
        throw error;
      }
    });
  }

  pieceStored(task: BlobTask, index: number, length: number, provenance: PieceProvenance): void {
    this.spans.forget(task.digest, index);
    this.downloads.get(task.digest)?.pieceStored(index, provenance, length);
  }

  verified(task: BlobTask): void {
    this.onDemand.delete(task.digest);
    const download = this.downloads.get(task.digest);
    // No download: a blob verified from disk after start-up; offer it like the others.
    if (download) download.completed();
    else if (this.started && !this.closing) this.downloadFor(task).announceHolding();
  }

  /** Leaves the task's swarm; `contentMismatch`: the blob failed its digest (the scheduler forgets what this peer vouched for). */
  forget(digest: string, reason: string, { contentMismatch = false } = {}): void {
    this.onDemand.delete(digest);
    this.spans.forget(digest);
    this.downloads.get(digest)?.close(reason, contentMismatch);
  }

  /** `POST /_starling/seed` on a seed: fetch the task from its origin for the swarm, each piece as a child asks for it. */
  async seedTask(request: BlobFetchRequest): Promise<void> {
    if (!this.options.seed) throw new Error('this peer is not a seed');
    await this.fetchTask(request, 'seed');
  }

  /** `POST /_starling/preheat` from the manager: fetch the task through the swarm ahead of need. */
  async preheatTask(request: BlobFetchRequest): Promise<void> {
    await this.fetchTask(request, 'preheat');
  }

  /** How a preheated (or seeded) task is doing, for the manager's job progress. */
  fetchStatus(digest: string): FetchStatus | undefined {
    const lease = this.tasks.lease(digest);
    const error = this.fetchErrors.get(digest);
    if (!lease) return error ? { digest, size: 0, storedBytes: 0, complete: false, error } : undefined;
    try {
      const { task } = lease;
      return { digest, size: task.size, storedBytes: task.blob.storedBytes, complete: task.complete, ...(error ? { error } : {}) };
    } finally {
      lease.release();
    }
  }

  private readonly fetchErrors = new Map<string, string>();

  /**
   * Fetches a task on someone else's behalf: the whole of it for the manager's preheat, the pieces
   * children ask for on the scheduler's seed trigger.
   */
  private async fetchTask(request: BlobFetchRequest, why: 'seed' | 'preheat'): Promise<void> {
    if (request.pieceSize !== pieceSizeFor(request.contentLength)) {
      throw new Error(
        `piece size ${request.pieceSize} does not match ${pieceSizeFor(request.contentLength)} for ${request.contentLength} bytes`,
      );
    }
    const originUrl = new URL(request.origin.url);
    const { registry, repository, digest } = parseBlobUrl(originUrl);
    if (digest !== request.taskId) throw new Error(`origin.url names blob ${digest}, not the task ${request.taskId}`);
    const withCredentials = Object.keys(request.origin.headers).some((key) => key.toLowerCase() === 'authorization');
    const lease = await this.tasks.open(request.taskId, async () => ({
      size: request.contentLength,
      source: { registry, repository, public: !withCredentials || (await readableAnonymously(this.transport, originUrl)) },
    }));
    const { task } = lease;
    if (task.size !== request.contentLength) {
      lease.release();
      throw new Error(`task ${request.taskId} is stored here with ${task.size} bytes, not ${request.contentLength}`);
    }
    this.fetchErrors.delete(task.digest);
    // A seed fills the pieces it reads around the spans it read of them for lazy readers.
    const origin = new OriginSource(
      new URL(request.origin.url),
      request.origin.headers,
      this.transport,
      this.downloadLimiter,
      this.log,
      this.options.originCounts,
      why === 'seed' ? (index) => this.spans.complete(task.digest, index) : undefined,
    );
    this.log.info({ task: task.digest, origin: new URL(request.origin.url).host, why }, 'fetching task for the swarm');
    if (why === 'seed') {
      // Piece by piece as children ask (fetchForChild): they ask for every piece of a blob they
      // download whole, so the registry still sends it once, and for a lazily read one only what
      // its readers read. Measured end to end (8 nodes starting a 390 MB image that reads 26 MB),
      // a seed reading whole blobs made the registry send 13.2 copies of the bytes needed.
      this.onDemand.set(task.digest, { source: this.sourceFor(task, origin), origin });
      this.downloadFor(task).serveOnDemand(origin);
      lease.release();
      return;
    }
    task.request(0, task.layout.pieceCount - 1, this.sourceFor(task, origin));
    task
      .whenPersisted()
      .catch((error: Error) => {
        this.fetchErrors.set(task.digest, error.message);
        this.log.warn({ task: task.digest, err: error.message, why }, 'fetch for the swarm failed');
      })
      .finally(() => lease.release());
    // A fetch that fails before verification (origin refused, pieces lost) is reported too.
    for (let index = 0; index < task.layout.pieceCount; index++) {
      task.waitForPiece(index).catch((error: Error) => {
        if (!task.hasPiece(index)) this.fetchErrors.set(task.digest, error.message);
      });
    }
  }

  /** Tasks this seed fetches piece by piece as children ask for them, each with the source it fetches through. */
  private readonly onDemand = new Map<string, { source: PieceSource; origin: OriginSource }>();

  /** This peer fetches any piece of the task a child asks for (a seed the scheduler triggered for it). */
  offersOnDemand(digest: string): boolean {
    return !this.closing && (this.onDemand.has(digest) || this.relaySource(digest) !== undefined);
  }

  /**
   * How a peer that is reading a public blob itself fetches a piece a child asks for: through its
   * own download (its parents, or the origin if the scheduler sends it there). In a chain, a lazy
   * reader's one parent reads other parts of the blob than its child; without this, a piece only
   * the child wants came from nowhere until the child's stall sent it to the registry (60 s).
   */
  private relaySource(digest: string): PieceSource | undefined {
    const download = this.downloads.get(digest);
    const origin = download?.origin;
    if (!download || !origin || !download.task.blob.sources[0]?.public) return undefined;
    return this.sourceFor(download.task, origin);
  }

  /**
   * A child asked for piece `index`: fetch it (once, whoever asks) if this peer seeds the task on
   * demand, and the rest of the blob after it when the child downloads the whole blob. Then the
   * seed stays ahead of its children and reports every piece's digest early, as a seed reading
   * whole blobs did: children that lose every scheduler go on with their parents, which they can
   * do only for pieces already vouched for (test 'completes every pull when the scheduler dies').
   */
  fetchForChild(task: BlobTask, index: number, wish: PieceWish): 'fetching' | 'put-off' | 'not-offered' {
    if (this.closing) return 'not-offered';
    const priority = wish.background ? 'background' : 'demand';
    const seeded = this.onDemand.get(task.digest);
    if (seeded) {
      // Until its children's reads, and the swarm's, quieten, the registry's link carries only what workloads wait for.
      if (putsBackgroundOff(wish, this.lastDemandAt, Date.now(), this.downloads.get(task.digest)?.swarmReadingSince)) return 'put-off';
      task.request(index, index, seeded.source, priority);
      if (wish.wholeBlob) task.request(0, task.layout.pieceCount - 1, seeded.source);
      return 'fetching';
    }
    // A peer in the middle passes the piece on with the child's priority (the seed upstream puts
    // background pieces off); a child downloading the whole blob asks its parents only for what they hold.
    const relay = this.relaySource(task.digest);
    if (!relay) return 'not-offered';
    task.request(index, index, relay, priority);
    return 'fetching';
  }

  /** When a child last asked this peer for a piece a workload waits for. */
  private lastDemandAt = 0;

  /** A child asked for a piece a workload waits for (fetchForChild puts background pieces off a while). */
  pieceDemanded(): void {
    this.lastDemandAt = Date.now();
  }

  private downloadFor(task: BlobTask): SwarmDownload {
    let download = this.downloads.get(task.digest);
    if (!download) {
      download = new SwarmDownload(task, this.schedulers, this.dispatcher, this.options, this.log, (closed) => {
        if (this.downloads.get(task.digest) === closed) this.downloads.delete(task.digest);
      });
      this.downloads.set(task.digest, download);
    }
    return download;
  }

  async close(): Promise<void> {
    this.closing = true;
    this.managerClient?.stop();
    for (const download of [...this.downloads.values()]) download.close('peer shutting down');
    await this.schedulers.leave(this.options.hostId);
    this.schedulers.close();
    await this.dispatcher.close();
  }
}
