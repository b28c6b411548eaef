// `starling snapshotter` as a running service: restore what a previous process left, then serve
// snapshots.v1 on the unix socket (and metrics over HTTP when asked).
import * as grpc from '@grpc/grpc-js';
import fsp from 'node:fs/promises';
import path from 'node:path';
import type { Server } from 'node:http';
import type { Logger } from '../common/log.js';
import { closeHttp, listenHttp } from '../common/http-server.js';
import { createMetricsRegistry, serveMetrics } from '../common/metrics.js';
import type { SnapshotterConfig } from './config.js';
import { snapshotsHandlers, SnapshotsService } from './grpc-service.js';
import { Layout } from './layout.js';
import { MetadataStore } from './metadata.js';
import { registerSnapshotterMetrics } from './metrics.js';
import { FuseServerClient } from './fuse-server/client.js';
import { RemoteLayers, type LayerMounter, type RemoteLayerSettings } from './remote-layers.js';
import { Snapshotter } from './snapshotter.js';

export interface RunningSnapshotter {
  snapshotter: Snapshotter;
  socket: string;
  metricsAddress?: string;
  close(): Promise<void>;
}

export async function startSnapshotter(config: SnapshotterConfig, log: Logger): Promise<RunningSnapshotter> {
  const layout = new Layout(path.resolve(config.root));
  await fsp.mkdir(layout.root, { recursive: true, mode: 0o700 });
  const settings: RemoteLayerSettings = {
    peer: config.peer,
    prefetch: config.prefetch,
    backgroundFetch: config.backgroundFetch,
    fuse: config.fuse,
  };
  const remote: LayerMounter = config.fuseServer.enabled
    ? new FuseServerClient({
        root: layout.root,
        settings,
        logLevel: config.log.level,
        idleExitSeconds: config.fuseServer.idleExitSeconds,
        log: log.child({ part: 'fuse-client' }),
      })
    : new RemoteLayers(settings, log);
  const snapshotter = new Snapshotter(layout, MetadataStore.open(layout.metadataFile), remote, log);
  await snapshotter.restore();

  const socket = path.resolve(config.socket);
  await fsp.mkdir(path.dirname(socket), { recursive: true });
  await fsp.rm(socket, { force: true }); // a stale socket from a killed process
  const server = new grpc.Server();
  server.addService(SnapshotsService().service, snapshotsHandlers(snapshotter, log));
  await new Promise<void>((resolve, reject) =>
    server.bindAsync(`unix:${socket}`, grpc.ServerCredentials.createInsecure(), (error) => (error ? reject(error) : resolve())),
  );

  let metricsServer: Server | undefined;
  let metricsAddress: string | undefined;
  if (config.metrics.listen) {
    const registry = createMetricsRegistry();
    registerSnapshotterMetrics(registry, remote);
    ({ server: metricsServer, address: metricsAddress } = await listenHttp(
      config.metrics.listen,
      (req, res) => {
        if (req.url !== '/metrics') return void res.writeHead(404).end();
        void serveMetrics(registry, res);
      },
      { what: 'snapshotter metrics', limits: { maxConnections: 256 }, log },
    ));
  }
  log.info(
    { socket, root: layout.root, peer: config.peer, metrics: metricsAddress, fuseServer: config.fuseServer.enabled },
    'snapshotter ready',
  );

  return {
    snapshotter,
    socket,
    metricsAddress,
    async close() {
      await new Promise<void>((resolve) => server.tryShutdown(() => resolve()));
      if (metricsServer) await closeHttp(metricsServer);
      await snapshotter.close();
      await fsp.rm(socket, { force: true });
    },
  };
}
