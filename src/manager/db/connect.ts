import { mkdirSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import SqliteDatabase from 'better-sqlite3';
import {
  CompiledQuery,
  Kysely,
  PostgresDialect,
  SqliteDialect,
  SqliteDriver,
  sql,
  type DatabaseConnection,
  type Driver,
  type SqliteDialectConfig,
} from 'kysely';
import pg from 'pg';
import { UserError } from '../../common/errors.js';
import { migrateToLatest } from '../migrations/index.js';
import type { Database } from './schema.js';

export type Dialect = 'sqlite' | 'postgres';

export interface Store {
  db: Kysely<Database>;
  dialect: Dialect;
  /** Where the data is, without a password: for logs. */
  where: string;
  /** The migrations this opening applied (none when another process, or an earlier start, had). */
  migrationsApplied: string[];
  /**
   * Runs `work` while no other manager process runs its own `exclusive` work on this database:
   * replicas starting together migrate and create the first admin one after another.
   */
  exclusive<T>(work: () => Promise<T>): Promise<T>;
  close(): Promise<void>;
}

// PostgreSQL sends 64-bit integers (bigint columns, count(*)) and numerics (sum()) as strings so
// nothing is lost past 2^53; byte counts and epoch milliseconds stay far below that, so the
// manager reads them as numbers, the same as SQLite gives, in this one place.
const INT8_OID = 20;
const NUMERIC_OID = 1700;
type TypeParser = (value: string) => unknown;
const pgTypes = {
  getTypeParser(oid: number, format?: 'text' | 'binary'): TypeParser {
    if (oid === INT8_OID || oid === NUMERIC_OID) return (value: string) => Number(value);
    return pg.types.getTypeParser(oid, format) as TypeParser; // pg-types declares its parsers as any
  },
};

/** A session-level PostgreSQL advisory lock key of the manager's own (Kysely's migrator holds another). */
const STARTUP_LOCK_KEY = 0x5374_6172; // "Star"

/** A new connection waits this long for the server; past it the call fails (and readiness says so). */
const CONNECT_TIMEOUT_MS = 5_000;

/**
 * Opens `sqlite:PATH` or `postgres://...` and migrates it to the latest schema, one process at a
 * time: replicas started together apply each migration once, and none serves on an older schema.
 */
export async function openStore(url: string): Promise<Store> {
  const store = url.startsWith('sqlite:') ? openSqlite(url.slice('sqlite:'.length)) : openPostgres(url);
  try {
    const migrate = () => migrateToLatest(store.db, store.dialect);
    store.migrationsApplied = await store.exclusive(store.dialect === 'sqlite' ? () => underSqliteWriteLock(store.db, migrate) : migrate);
  } catch (error) {
    await store.close();
    throw new UserError(`${store.where}: ${(error as Error).message}`);
  }
  return store;
}

/**
 * Kysely runs SQLite migrations outside any transaction (SQLite's DDL is not transactional to it), so
 * two processes on one empty file could both see no schema and both create it: the whole migration
 * runs under the write lock (`BEGIN IMMEDIATE`; the others wait busy_timeout for it). Its statements
 * use the same single connection, so they run inside this transaction.
 */
async function underSqliteWriteLock<T>(db: Kysely<Database>, work: () => Promise<T>): Promise<T> {
  await sql`begin immediate`.execute(db);
  try {
    const result = await work();
    await sql`commit`.execute(db);
    return result;
  } catch (error) {
    await sql`rollback`.execute(db).catch(() => undefined);
    throw error;
  }
}

function openSqlite(path: string): Store {
  const file = resolve(path);
  mkdirSync(dirname(file), { recursive: true });
  let database: SqliteDatabase.Database;
  try {
    database = new SqliteDatabase(file);
  } catch (error) {
    throw new UserError(`cannot open SQLite database ${file}: ${(error as Error).message}`);
  }
  // WAL lets readers go on while a keep-alive writes; foreign keys are off by default in SQLite.
  database.pragma('journal_mode = WAL');
  database.pragma('foreign_keys = ON');
  database.pragma('busy_timeout = 5000');
  const db = new Kysely<Database>({ dialect: new ImmediateSqliteDialect({ database }) });
  return {
    db,
    dialect: 'sqlite',
    where: `sqlite:${file}`,
    migrationsApplied: [],
    // SQLite's own locking is enough: every transaction takes the write lock as it begins.
    exclusive: (work) => work(),
    close: () => db.destroy(),
  };
}

/**
 * SQLite with `BEGIN IMMEDIATE` transactions: the write lock is taken as a transaction begins, so a
 * second process waits (busy_timeout) and then reads what the first wrote. With a plain `BEGIN`
 * both read first: of three managers started together on one empty file, one decided to migrate
 * after another had, and died on 'table "scheduler_clusters" already exists'.
 */
class ImmediateSqliteDialect extends SqliteDialect {
  constructor(private readonly settings: SqliteDialectConfig) {
    super(settings);
  }

  override createDriver(): Driver {
    return new ImmediateSqliteDriver(this.settings);
  }
}

class ImmediateSqliteDriver extends SqliteDriver {
  override async beginTransaction(connection: DatabaseConnection): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw('begin immediate'));
  }
}

function openPostgres(url: string): Store {
  const pool = new pg.Pool({ connectionString: url, max: 10, types: pgTypes, connectionTimeoutMillis: CONNECT_TIMEOUT_MS });
  // An idle connection dropped by the server must not crash the process; the pool reconnects.
  pool.on('error', () => {});
  // Nor one the server drops while it is checked out (pg-pool listens only while a client is idle):
  // between the statements of a transaction a terminated backend (a failover, an administrator's
  // pg_terminate_backend) is an 'error' event on the client, and the next statement fails on its
  // own, which the caller handles.
  pool.on('connect', (client) => client.on('error', () => {}));
  const db = new Kysely<Database>({ dialect: new PostgresDialect({ pool }) });
  const safe = new URL(url);
  if (safe.password) safe.password = '***';
  return {
    db,
    dialect: 'postgres',
    where: safe.href,
    migrationsApplied: [],
    async exclusive(work) {
      // Held by one session (connection) for the whole of `work`, which uses the pool's others.
      const client = await pool.connect().catch((error: Error) => {
        throw new Error(`cannot connect: ${error.message}`);
      });
      try {
        await client.query('SELECT pg_advisory_lock($1)', [STARTUP_LOCK_KEY]);
        try {
          return await work();
        } finally {
          await client.query('SELECT pg_advisory_unlock($1)', [STARTUP_LOCK_KEY]);
        }
      } finally {
        client.release();
      }
    },
    close: () => db.destroy(),
  };
}
