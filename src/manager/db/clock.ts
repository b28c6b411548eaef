import { sql, type RawBuilder } from 'kysely';
import type { Dialect } from './connect.js';

/**
 * The database server's time in epoch milliseconds, as an SQL expression. Leases are written and
 * judged by this one clock, so replicas whose own clocks disagree still agree on whose lease has
 * run out.
 */
export function databaseNowMs(dialect: Dialect): RawBuilder<number> {
  // clock_timestamp(), not now(): now() stands still for the whole of a transaction.
  if (dialect === 'postgres') return sql<number>`(extract(epoch from clock_timestamp()) * 1000)::bigint`;
  // SQLite's 'now' is fixed for one statement; julianday counts days from noon, 4714 BC.
  return sql<number>`cast((julianday('now') - 2440587.5) * 86400000 as integer)`;
}
