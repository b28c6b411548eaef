import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { FastifyInstance } from 'fastify';
import { UserError } from '../common/errors.js';
import type { Logger } from '../common/log.js';
import { createMetricsRegistry } from '../common/metrics.js';
import { formatHostPort, parseListenAddress } from '../common/net.js';
import { httpScheme, loadTls } from '../common/tls.js';
import { readTokenFile } from '../common/token.js';
import { buildApi } from './api/app.js';
import { databaseUrl, type ManagerConfig } from './config.js';
import { openStore, type Store } from './db/connect.js';
import { createManagerMetrics } from './metrics.js';
import { bootstrapAdmin } from './services/auth.js';
import { JobEngine } from './services/jobs.js';
import { markSilentInactive } from './services/members.js';
import { checkReadiness } from './services/readiness.js';

export interface RunningManager {
  /** host:port it listens on. */
  address: string;
  url: string;
  /** This replica's name in the jobs it holds. */
  replica: string;
  /** The admin token generated at the first start (when no --admin-token-file was given); shown once. */
  initialAdminToken?: string;
  store: Store;
  jobs: JobEngine;
  app: FastifyInstance;
  close(): Promise<void>;
}

/** The console's build output next to the package: console/dist (from src/ or dist/ alike). */
export const DEFAULT_CONSOLE_DIR = fileURLToPath(new URL('../../console/dist', import.meta.url));

/**
 * Starts one manager replica. Any number may share a PostgreSQL database: each migrates (one at a
 * time) before it listens, every request reads the database, and a preheat job is run by one
 * replica at a time under a lease (services/job-leases.ts).
 */
export async function startManager(config: ManagerConfig, log: Logger): Promise<RunningManager> {
  const { host, port } = parseListenAddress(config.listen, 'manager listen address');
  const clusterToken = readTokenFile(config.clusterTokenFile);
  if (!clusterToken) {
    throw new UserError(
      'the manager needs the cluster token (--cluster-token-file, or clusterTokenFile): without it anyone who reaches it could register a scheduler',
    );
  }
  const tls = loadTls(config.tls);
  const adminToken = readAdminToken(config.adminTokenFile);
  const replica = replicaName();
  const store = await openStore(databaseUrl(config));
  log.info(
    { db: store.where, applied: store.migrationsApplied },
    store.migrationsApplied.length ? 'database migrated' : 'database schema already current',
  );
  const livenessMs = config.keepalive.intervalMs * config.keepalive.missedLimit;
  let sweeper: NodeJS.Timeout | undefined;
  let jobs: JobEngine | undefined;
  let app: FastifyInstance | undefined;
  const stopWatchingToken = clusterToken.watch(log);
  try {
    // One replica at a time: of replicas started together on an empty database, one creates the admin.
    const admin = await store.exclusive(() => bootstrapAdmin(store.db, adminToken));
    if (!admin.givenTokenKnown) {
      log.warn(
        { file: config.adminTokenFile },
        'the token in the admin token file is not a valid token here (it is only used at the first start)',
      );
    }
    const registry = createMetricsRegistry();
    const metrics = createManagerMetrics(registry, store.db);
    jobs = new JobEngine(
      store.db,
      store.dialect,
      {
        ...config.preheat,
        livenessMs,
        insecureRegistries: config.registries.insecure,
        clusterToken,
        replica,
        tls,
        onFinished: (state) => metrics.jobsFinished.inc({ state }),
      },
      log.child({ component: 'jobs', replica }),
    );
    await jobs.start();
    app = buildApi(
      {
        db: store.db,
        jobs,
        metrics: registry,
        livenessMs,
        clusterToken,
        tls,
        consoleDir: resolve(config.consoleDir ?? DEFAULT_CONSOLE_DIR),
        readiness: () => checkReadiness(store.db, store.dialect, replica),
      },
      metrics,
      log,
    );
    await app.listen({ host, port });
    const bound = app.server.address();
    const address = typeof bound === 'object' && bound ? formatHostPort({ host: bound.address, port: bound.port }) : config.listen;

    // Inactivity is also checked when schedulers are handed out; the sweep makes it visible and audited.
    sweeper = setInterval(() => {
      markSilentInactive(store.db, livenessMs).catch((error: Error) => log.warn({ err: error.message }, 'liveness sweep failed'));
    }, config.keepalive.intervalMs);
    sweeper.unref();

    log.info({ address, db: store.where, replica, tls: Boolean(tls) }, 'manager listening');
    const running: RunningManager = {
      address,
      url: `${httpScheme(tls)}://${address}`,
      replica,
      initialAdminToken: admin.generated,
      store,
      jobs,
      app,
      async close() {
        stopWatchingToken();
        clearInterval(sweeper);
        await running.jobs.close();
        await closeGracefully(running.app);
        await store.close();
      },
    };
    return running;
  } catch (error) {
    stopWatchingToken();
    clearInterval(sweeper);
    await jobs?.close();
    await app?.close();
    await store.close();
    throw error;
  }
}

/** Unique per process (a restarted replica holds none of its former self's jobs); the host name says where it ran. */
function replicaName(): string {
  return `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`;
}

function readAdminToken(path: string | undefined): string | undefined {
  if (!path) return undefined;
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    throw new UserError(`cannot read admin token file ${path}: ${(error as Error).message}`);
  }
  const token = text.trim();
  if (token.length < 16 || /\s/.test(token))
    throw new UserError(`admin token in ${path} must be at least 16 characters without whitespace`);
  return token;
}

/**
 * Stops accepting requests and lets those in flight finish, for a short while only: a keep-alive
 * connection that was busy when closing began would otherwise hold the process for the
 * server's whole keep-alive timeout.
 */
async function closeGracefully(app: FastifyInstance, graceMs = 2_000): Promise<void> {
  const timer = setTimeout(() => app.server.closeAllConnections(), graceMs);
  try {
    await app.close();
  } finally {
    clearTimeout(timer);
  }
}
