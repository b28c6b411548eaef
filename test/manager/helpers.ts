// Shared pieces of the manager tests: both databases, a manager started in-process on a free
// loopback port, and a small JSON client.

import fsp from 'node:fs/promises';
import path from 'node:path';
import { fetch, type Dispatcher } from 'undici';
import { silentLogger } from '../../src/common/log.js';
import { managerConfigSchema, type ManagerConfig } from '../../src/manager/config.js';
import { startManager, type RunningManager } from '../../src/manager/server.js';
import { makeTempDir, type TempDir } from '../fixtures/processes.js';
import { startPostgres, type Postgres } from './postgres.js';

export interface Backend {
  name: 'sqlite' | 'postgres';
  /** A new, empty database. */
  newDatabase(): Promise<string>;
  stop(): Promise<void>;
}

/** SQLite (a file in a temp dir) and a real PostgreSQL server, each handing out empty databases. */
export function backends(): Backend[] {
  let tmp: Promise<TempDir> | undefined;
  let counter = 0;
  let postgres: Promise<Postgres> | undefined;
  return [
    {
      name: 'sqlite',
      async newDatabase() {
        tmp ??= makeTempDir('starling-manager-db-');
        return `sqlite:${path.join((await tmp).path, `manager-${++counter}.db`)}`;
      },
      async stop() {
        if (tmp) await (await tmp).remove();
      },
    },
    {
      name: 'postgres',
      async newDatabase() {
        postgres ??= startPostgres();
        return (await postgres).createDatabase();
      },
      async stop() {
        if (postgres) await (await postgres).stop();
      },
    },
  ];
}

export const ADMIN_TOKEN = 'admin-token-for-tests-0123456789';
export const CLUSTER_TOKEN = 'cluster-token-for-tests-0123456789';

export interface TestManager {
  manager: RunningManager;
  url: string;
  db: string;
  config: ManagerConfig;
  /** Stops this manager and starts another on the same database and files. */
  restart(): Promise<TestManager>;
  stop(): Promise<void>;
}

export async function startTestManager(db: string, overrides: Record<string, unknown> = {}, files?: TempDir): Promise<TestManager> {
  const dir = files ?? (await makeTempDir('starling-manager-files-'));
  const adminTokenFile = path.join(dir.path, 'admin-token');
  const clusterTokenFile = path.join(dir.path, 'cluster-token');
  await fsp.writeFile(adminTokenFile, `${ADMIN_TOKEN}\n`);
  await fsp.writeFile(clusterTokenFile, `${CLUSTER_TOKEN}\n`);
  const config = managerConfigSchema.parse({
    listen: '127.0.0.1:0',
    db,
    dataDir: dir.path,
    adminTokenFile,
    clusterTokenFile,
    consoleDir: path.join(dir.path, 'console'),
    keepalive: { intervalMs: 100, missedLimit: 3 },
    preheat: { pollMs: 50, timeoutMs: 10_000, concurrency: 8 },
    ...overrides,
  });
  const manager = await startManager(config, silentLogger);
  const self: TestManager = {
    manager,
    url: manager.url,
    db,
    config,
    async restart() {
      await manager.close();
      return startTestManager(db, overrides, dir);
    },
    async stop() {
      await manager.close();
      if (!files) await dir.remove();
    },
  };
  return self;
}

export interface Answer<T = any> {
  status: number;
  body: T;
}

/**
 * A JSON request; `token` is sent as a Bearer token, `raw` as the body unchanged, through
 * `dispatcher` when given (an https manager: an Agent that trusts the cluster CA).
 */
export async function call<T = any>(
  base: string,
  method: string,
  pathname: string,
  options: { token?: string; body?: unknown; raw?: string; headers?: Record<string, string>; dispatcher?: Dispatcher } = {},
): Promise<Answer<T>> {
  const headers: Record<string, string> = { ...options.headers };
  if (options.token) headers.authorization = `Bearer ${options.token}`;
  let body: string | undefined;
  if (options.raw !== undefined) body = options.raw;
  else if (options.body !== undefined) body = JSON.stringify(options.body);
  if (body !== undefined) headers['content-type'] ??= 'application/json';
  const res = await fetch(`${base}${pathname}`, { method, headers, body, dispatcher: options.dispatcher });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {
    // not JSON (metrics, console files)
  }
  return { status: res.status, body: parsed as T };
}

/** Every row of every table: to prove that refused requests changed nothing. */
export async function snapshot(manager: RunningManager): Promise<Record<string, unknown[]>> {
  const tables = ['scheduler_clusters', 'schedulers', 'peers', 'peer_tasks', 'jobs', 'job_tasks', 'users', 'tokens', 'audit_log'] as const;
  const out: Record<string, unknown[]> = {};
  for (const table of tables) out[table] = await manager.store.db.selectFrom(table).selectAll().execute();
  return out;
}

export function peerBody(hostId: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    hostId,
    hostname: `host-${hostId}`,
    ip: '127.0.0.1',
    uploadPort: 65002,
    mirrorUrl: 'http://127.0.0.1:65001',
    labels: {},
    seed: false,
    ...extra,
  };
}
