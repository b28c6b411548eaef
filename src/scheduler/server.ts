import { networkInterfaces } from 'node:os';
import { closeHttp, listenHttp } from '../common/http-server.js';
import type { Logger } from '../common/log.js';
import { createMetricsRegistry, serveMetrics } from '../common/metrics.js';
import { isFromThisHost, parseListenAddress } from '../common/net.js';
import { UserError } from '../common/errors.js';
import { loadTls } from '../common/tls.js';
import { readTokenFile } from '../common/token.js';
import { limitedGrpcServer, listenGrpc } from '../rpc/grpc-listener.js';
import { SchedulerService, schedulerServerCredentials } from '../rpc/proto.js';
import type { SchedulerConfig } from './config.js';
import { ManagerLink } from './manager-link.js';
import { createSchedulerMetrics } from './metrics.js';
import { Resources } from './resources.js';
import { Scheduling } from './scheduling.js';
import { SeedTrigger } from './seed-trigger.js';
import { schedulerHandlers } from './service.js';

export interface RunningScheduler {
  address: string;
  metricsAddress: string;
  scheduling: Scheduling;
  close(): Promise<void>;
}

/** Starts the scheduler: the gRPC service, the periodic passes and /metrics. */
export async function startScheduler(config: SchedulerConfig, log: Logger): Promise<RunningScheduler> {
  const clusterToken = readTokenFile(config.clusterTokenFile);
  if (!clusterToken) {
    throw new UserError('the scheduler needs the cluster token (--cluster-token-file, or clusterTokenFile): every peer must present it');
  }
  const stopWatchingToken = clusterToken.watch(log);
  const tls = loadTls(config.tls);
  const resources = new Resources();
  const registry = createMetricsRegistry();
  const metrics = createSchedulerMetrics(registry, resources);
  const seeds = new SeedTrigger(clusterToken, tls);
  const scheduling = new Scheduling(
    resources,
    config.scheduling,
    {
      now: () => Date.now(),
      triggerSeed: async (seed, task) => {
        try {
          await seeds.trigger(seed, task);
          metrics.seedTriggers.inc({ result: 'accepted' });
        } catch (error) {
          metrics.seedTriggers.inc({ result: 'failed' });
          throw error;
        }
      },
      onScheduled: (_peer, outcome, latencyMs) => metrics.schedulingSeconds.observe({ outcome }, latencyMs / 1000),
      onBytes: (_task, source, bytes) => metrics.bytes.inc({ source }, bytes),
    },
    log,
  );

  const server = limitedGrpcServer(config.limits);
  server.addService(
    SchedulerService().service,
    schedulerHandlers(scheduling, { keepaliveIntervalMs: config.keepaliveIntervalMs, clusterToken, metrics, log }),
  );
  const listen = parseListenAddress(config.listen, 'scheduler listen address');
  const grpcListener = await listenGrpc(server, config.listen, schedulerServerCredentials(tls), {
    limits: config.limits,
    what: 'scheduler gRPC',
    log,
  });
  const { address, port } = grpcListener;

  const metricsServer = await listenHttp(
    config.metricsListen,
    (req, res) => {
      if (req.url === '/metrics') {
        void serveMetrics(registry, res);
      } else if (req.url === '/healthz') {
        res.end('ok\n');
      } else if (req.url?.startsWith('/api/tasks/')) {
        // Read-only task state for operators and tests. It names the hosts holding a blob, their
        // addresses and labels: for this host, or a holder of the cluster token.
        if (!isFromThisHost(req.socket) && !clusterToken.accepts(req.headers.authorization)) {
          res.writeHead(403, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ error: 'task state is only for the local host or a holder of the cluster token' }));
          return;
        }
        const stat = scheduling.stat(decodeURIComponent(req.url.slice('/api/tasks/'.length)));
        res.writeHead(stat ? 200 : 404, { 'content-type': 'application/json' });
        res.end(JSON.stringify(stat ?? { error: 'no such task' }));
      } else {
        res.writeHead(404).end();
      }
    },
    { what: 'scheduler metrics', limits: { maxConnections: 256 }, log },
  );

  let managerLink: ManagerLink | undefined;
  if (config.manager) {
    managerLink = new ManagerLink(
      new URL(config.manager),
      { ip: advertisedIp(listen.host), port, clusterName: config.clusterName },
      clusterToken,
      tls,
      (settings) => {
        scheduling.config = settings;
      },
      log,
    );
    await managerLink.start();
  }

  const timers = [
    setInterval(() => scheduling.tick(), config.tickMs),
    setInterval(() => {
      for (const host of scheduling.expireHosts(3 * config.keepaliveIntervalMs)) log.info({ host: host.id }, 'host went silent; dropped');
      scheduling.expireTasks(config.taskTtlMs);
    }, config.keepaliveIntervalMs),
  ];
  for (const timer of timers) timer.unref();
  log.info({ address, metrics: metricsServer.address }, 'scheduler listening');

  return {
    address,
    metricsAddress: metricsServer.address,
    scheduling,
    async close() {
      stopWatchingToken();
      managerLink?.stop();
      for (const timer of timers) clearInterval(timer);
      await grpcListener.close();
      await closeHttp(metricsServer.server);
      await seeds.close();
    },
  };
}

/** The address peers should dial: the listen address, or this host's first external IPv4 when listening on all. */
function advertisedIp(listenHost: string): string {
  if (listenHost !== '0.0.0.0' && listenHost !== '::') return listenHost;
  for (const addresses of Object.values(networkInterfaces())) {
    for (const address of addresses ?? []) if (address.family === 'IPv4' && !address.internal) return address.address;
  }
  return '127.0.0.1';
}
