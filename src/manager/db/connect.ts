import { mkdirSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import SqliteDatabase from 'better-sqlite3';
import { Kysely, PostgresDialect, SqliteDialect } from 'kysely';
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
  close(): Promise<void>;
}

// PostgreSQL sends 64-bit integers (bigint columns, count(*)) and numerics (sum()) as strings so
// nothing is lost past 2^53; byte counts and epoch milliseconds stay far below that, so the
// manager reads them as numbers, the same as SQLite gives, in this one place.
const INT8_OID = 20;
const NUMERIC_OID = 1700;
const pgTypes = {
  getTypeParser(oid: number, format?: 'text' | 'binary') {
    if (oid === INT8_OID || oid === NUMERIC_OID) return (value: string) => Number(value);
    return pg.types.getTypeParser(oid, format as 'text');
  },
} as pg.CustomTypesConfig;

/** Opens `sqlite:PATH` or `postgres://...` and migrates it to the latest schema. */
export async function openStore(url: string): Promise<Store> {
  const store = url.startsWith('sqlite:') ? openSqlite(url.slice('sqlite:'.length)) : openPostgres(url);
  try {
    await migrateToLatest(store.db, store.dialect);
  } catch (error) {
    await store.close();
    throw new UserError(`${store.where}: ${(error as Error).message}`);
  }
  return store;
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
  const db = new Kysely<Database>({ dialect: new SqliteDialect({ database }) });
  return { db, dialect: 'sqlite', where: `sqlite:${file}`, close: () => db.destroy() };
}

function openPostgres(url: string): Store {
  const pool = new pg.Pool({ connectionString: url, max: 10, types: pgTypes });
  // An idle connection dropped by the server must not crash the process; the pool reconnects.
  pool.on('error', () => {});
  const db = new Kysely<Database>({ dialect: new PostgresDialect({ pool }) });
  const safe = new URL(url);
  if (safe.password) safe.password = '***';
  return { db, dialect: 'postgres', where: safe.href, close: () => db.destroy() };
}
