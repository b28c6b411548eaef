import { mkdir } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import { join, resolve } from 'node:path';
import type { Logger } from '../common/log.js';
import { createMetricsRegistry } from '../common/metrics.js';
import { parseListenAddress } from '../common/net.js';
import { RateLimiter } from '../common/rate-limiter.js';
import { RegistryHosts } from '../oci/registry-hosts.js';
import { RegistryTransport } from '../oci/transport.js';
import { BlobStore } from '../storage/blob-store.js';
import type { PeerConfig } from './config.js';
import { createPeerMetrics } from './metrics.js';
import { AccessChecker } from './mirror/access.js';
import { BlobService } from './mirror/blobs.js';
import { createMirrorServer } from './mirror/server.js';
import { UpstreamResolver } from './mirror/upstream.js';
import { TaskManager } from './task-manager.js';

export interface RunningPeer {
  /** host:port the mirror listens on (with the real port when 0 was asked). */
  mirrorAddress: string;
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

/** Starts the peer daemon: piece store, registry mirror, metrics. */
export async function startPeer(config: PeerConfig, log: Logger): Promise<RunningPeer> {
  const dataDir = resolve(config.dataDir);
  await mkdir(dataDir, { recursive: true });
  const metricsRegistry = createMetricsRegistry();
  let store: BlobStore | undefined;
  const metrics = createPeerMetrics(metricsRegistry, () => store);

  let tasks: TaskManager | undefined;
  store = await BlobStore.open(join(dataDir, 'store'), config.storage, log, (event) => {
    metrics.evictedBytes.inc(event.bytes);
    tasks?.forget(event.digest);
  });
  tasks = new TaskManager(store, log, {
    pieceStored: (_task, _index, bytes, from) => metrics.downloadedBytes.inc({ source: from }, bytes),
    verified: (task) => log.info({ digest: task.digest, size: task.size }, 'blob complete and verified'),
    failed: () => metrics.verificationFailures.inc(),
  });

  const transport = new RegistryTransport();
  const hosts = new RegistryHosts(config.registries.insecure);
  const upstreams = new UpstreamResolver(hosts, config.registries.default ? new URL(config.registries.default) : undefined);
  const blobs = new BlobService({
    tasks,
    transport,
    access: new AccessChecker(transport, log),
    downloadLimiter: new RateLimiter(config.download.rateLimit),
    metrics,
    log,
  });
  const taskList = tasks;
  const server = createMirrorServer({
    blobs,
    upstreams,
    transport,
    metricsRegistry,
    metrics,
    log,
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

  const listen = parseListenAddress(config.mirror.listen, 'mirror listen address');
  await new Promise<void>((resolveListen, reject) => {
    server.once('error', reject);
    server.listen(listen.port, listen.host, () => {
      server.off('error', reject);
      resolveListen();
    });
  });
  const address = server.address() as AddressInfo;
  const mirrorAddress = `${address.family === 'IPv6' ? `[${address.address}]` : address.address}:${address.port}`;
  log.info({ mirror: mirrorAddress, dataDir, quota: config.storage.quota }, 'peer mirror listening');

  return {
    mirrorAddress,
    async close() {
      await new Promise<void>((done) => {
        server.close(() => done());
        server.closeAllConnections();
      });
      await transport.close();
      await store?.close();
    },
  };
}
