import { mkdir } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { closeHttp, listenHttp } from '../common/http-server.js';
import type { Logger } from '../common/log.js';
import { createMetricsRegistry } from '../common/metrics.js';
import { parseListenAddress } from '../common/net.js';
import { RateLimiter } from '../common/rate-limiter.js';
import { UserError } from '../common/errors.js';
import { loadTls } from '../common/tls.js';
import { readTokenFile } from '../common/token.js';
import { RegistryHosts } from '../oci/registry-hosts.js';
import { RegistryTransport } from '../oci/transport.js';
import { BlobStore } from '../storage/blob-store.js';
import { Spool } from '../storage/spool.js';
import type { PeerConfig } from './config.js';
import { readLabelsFile } from './labels.js';
import { createPeerMetrics, originReadCounts } from './metrics.js';
import { AccessChecker } from './access/checker.js';
import { BlobService } from './mirror/blobs.js';
import { MIRROR_LIMITS, mirrorHandler } from './mirror/server.js';
import { UpstreamResolver } from './mirror/upstream.js';
import { defaultHostId, Swarm } from './swarm/swarm.js';
import { BlobDigestMismatchError } from './blob-task.js';
import { TaskManager } from './task-manager.js';
import { PieceBoard } from './upload/piece-board.js';
import { UploadService } from './upload/server.js';

export interface RunningPeer {
  /** host:port the mirror listens on (with the real port when 0 was asked). */
  mirrorAddress: string;
  /** host:port of the upload server, when the peer is in a swarm. */
  uploadAddress?: string;
  close(): Promise<void>;
}

/** Per-task figures shown by `starling stat` and /_starling/tasks. */
export interface TaskStatus {
  digest: string;
  size: number;
  complete: boolean;
  storedBytes: number;
  public: boolean;
  bytesFrom: { origin: number; peer: number; seed: number };
}

/** Starts the peer daemon: piece store, registry mirror, metrics, and the swarm when schedulers are given. */
export async function startPeer(config: PeerConfig, log: Logger): Promise<RunningPeer> {
  const inSwarm = config.swarm.schedulers.length > 0 || Boolean(config.swarm.manager);
  const clusterToken = readTokenFile(config.swarm.clusterTokenFile);
  const tls = loadTls(config.tls);
  if (inSwarm && !clusterToken) {
    throw new UserError(
      'a peer in a swarm needs the cluster token (--cluster-token-file, or swarm.clusterTokenFile): its upload port serves only holders of it',
    );
  }
  const dataDir = resolve(config.dataDir);
  await mkdir(dataDir, { recursive: true });
  const stopWatchingToken = clusterToken?.watch(log);
  const metricsRegistry = createMetricsRegistry();
  let store: BlobStore | undefined;
  const metrics = createPeerMetrics(metricsRegistry, () => store);
  const board = new PieceBoard();
  let swarm: Swarm | undefined;

  let tasks: TaskManager | undefined;
  store = await BlobStore.open(join(dataDir, 'store'), config.storage, log, (event) => {
    metrics.evictedBytes.inc(event.bytes);
    tasks?.forget(event.digest);
    swarm?.forget(event.digest, 'evicted');
  });
  tasks = new TaskManager(
    store,
    log,
    {
      pieceStored: (task, index, bytes, provenance) => {
        metrics.downloadedBytes.inc({ source: provenance.from }, bytes);
        board.notify(task.digest);
        swarm?.pieceStored(task, index, bytes, provenance);
      },
      // Children following this task hear of a piece as soon as it starts arriving (they may relay it).
      pieceGrowing: (task) => board.notify(task.digest),
      verified: (task) => {
        log.info({ digest: task.digest, size: task.size, from: task.bytesBySource }, 'blob complete and verified');
        board.notify(task.digest);
        swarm?.verified(task);
      },
      failed: (task, error) => {
        metrics.verificationFailures.inc();
        const mismatch = error instanceof BlobDigestMismatchError;
        swarm?.forget(task.digest, mismatch ? 'content does not match the digest' : `failed: ${error.message}`, {
          contentMismatch: mismatch,
        });
      },
    },
    inSwarm ? 'sha256' : 'crc',
  );

  const transport = new RegistryTransport();
  const downloadLimiter = new RateLimiter(config.download.rateLimit);

  const closers: Array<() => Promise<void>> = [];
  let uploadAddress: string | undefined;

  const access = new AccessChecker(transport, log);
  if (inSwarm && clusterToken) {
    // Seeds get no more slots than other peers: a seed serving many children at once gets every
    // piece out later (simulated 64 nodes × 21.4 GB: 32 seed slots 4.4 × T*, 8 slots 1.8 × T*).
    const uploadSlots = config.swarm.uploadSlots ?? 8;
    // The upload port listens before the swarm is made (the swarm announces its address).
    const joinedSwarm = (): Swarm => {
      if (!swarm) throw new Error('this peer is still joining the swarm; ask again shortly');
      return swarm;
    };
    const uploads = new UploadService({
      tasks,
      board,
      limiter: new RateLimiter(config.swarm.uploadRateLimit),
      slots: uploadSlots,
      clusterToken,
      access,
      log,
      onUploaded: (bytes) => metrics.uploadedBytes.inc(bytes),
      onRequest: (kind, outcome) => metrics.uploadRequests.inc({ kind, outcome }),
      seedTrigger: config.swarm.seed ? (request) => joinedSwarm().seedTask(request) : undefined,
      onDemand: {
        offers: (digest) => swarm?.offersOnDemand(digest) ?? false,
        demanded: () => swarm?.pieceDemanded(),
        fetch: (task, index, wish) => swarm?.fetchForChild(task, index, wish) ?? 'not-offered',
      },
      spans: (task, index, span, hops) => swarm?.span(task, index, span, hops),
      preheat: { start: (request) => joinedSwarm().preheatTask(request), status: (digest) => swarm?.fetchStatus(digest) },
    });
    const upload = await listenHttp(config.swarm.uploadListen, uploads.handle, {
      what: 'upload',
      tls,
      limits: { maxConnections: config.swarm.uploadMaxConnections },
      log,
    });
    uploadAddress = upload.address;
    const listen = parseListenAddress(upload.address);
    const advertiseIp = config.swarm.advertiseIp ?? (listen.host === '0.0.0.0' || listen.host === '::' ? '127.0.0.1' : listen.host);
    const labels = { ...(config.swarm.labelsFile ? readLabelsFile(config.swarm.labelsFile) : {}), ...config.swarm.labels };
    swarm = new Swarm(
      {
        schedulers: config.swarm.schedulers,
        manager: config.swarm.manager ? { url: new URL(config.swarm.manager), mirrorUrl: `http://${config.mirror.listen}` } : undefined,
        hostId: config.swarm.hostId ?? defaultHostId(advertiseIp, listen.port),
        clusterToken,
        tls,
        advertiseIp,
        uploadPort: listen.port,
        seed: config.swarm.seed,
        labels,
        uploadSlots,
        uploadBandwidth: config.swarm.uploadRateLimit,
        uploadSlotsInUse: () => uploads.slotsInUse,
        parallelism: config.swarm.pieceParallelism,
        perParent: config.swarm.perParent,
        pieceTimeoutMs: config.swarm.pieceTimeoutMs,
        stallMs: config.swarm.stallMs,
        onParentDropped: (reason) => metrics.parentsDropped.inc({ reason: reason.replace('FAILURE_REASON_', '').toLowerCase() }),
        originCounts: originReadCounts(metrics),
      },
      tasks,
      transport,
      downloadLimiter,
      log,
    );
    await swarm.start();
    const started = swarm;
    closers.push(
      () => started.close(),
      () => closeHttp(upload.server),
    );
    log.info({ upload: upload.address, schedulers: config.swarm.schedulers, seed: config.swarm.seed, labels }, 'peer joined the swarm');
  }

  const hosts = new RegistryHosts(config.registries.insecure);
  const upstreams = new UpstreamResolver(hosts, config.registries.default ? new URL(config.registries.default) : undefined);
  const joined = swarm;
  const blobs = new BlobService({
    tasks,
    sourceFor: joined ? (task, origin) => joined.sourceFor(task, origin) : undefined,
    spanFor: joined ? (task, index, span, origin) => joined.span(task, index, span, 0, origin) : undefined,
    transport,
    access,
    spool: await Spool.open(join(dataDir, 'spool'), config.storage.quota),
    downloadLimiter,
    metrics,
    log,
  });
  const taskList = tasks;
  const handler = mirrorHandler({
    blobs,
    upstreams,
    transport,
    metricsRegistry,
    metrics,
    log,
    clusterToken,
    status: (): { tasks: TaskStatus[] } => ({
      tasks: taskList.list().map((task) => ({
        digest: task.digest,
        size: task.size,
        complete: task.complete,
        storedBytes: task.blob.storedBytes,
        public: task.blob.isPublic,
        bytesFrom: { ...task.bytesBySource },
      })),
    }),
  });

  const mirror = await listenHttp(config.mirror.listen, handler, {
    what: 'peer mirror',
    limits: { ...MIRROR_LIMITS, maxConnections: config.mirror.maxConnections },
    log,
  });
  const mirrorAddress = mirror.address;
  log.info({ mirror: mirrorAddress, dataDir, quota: config.storage.quota }, 'peer mirror listening');

  return {
    mirrorAddress,
    uploadAddress,
    async close() {
      stopWatchingToken?.();
      await closeHttp(mirror.server);
      for (const close of closers) await close().catch((error: Error) => log.warn({ err: error.message }, 'error while closing'));
      await transport.close();
      await store?.close();
    },
  };
}
