import type { Kysely } from 'kysely';
import type { Dialect } from '../db/connect.js';
import type { Database } from '../db/schema.js';
import { missingMigrations } from '../migrations/index.js';

export interface Readiness {
  ready: boolean;
  /** The replica that answered: its name in the jobs it holds. */
  replica: string;
  /** Why not, when not ready. */
  reason?: string;
}

/** A probe waits no longer than this: Kubernetes' default probe timeout is 1 s, operators set more. */
const READINESS_TIMEOUT_MS = 2_000;

/**
 * Whether this replica can serve: the database answers, and has every migration this build
 * needs. (A replica migrates before it listens; a database restored from an older backup, or
 * one that cannot be reached, makes it unready until that is fixed.)
 */
export async function checkReadiness(db: Kysely<Database>, dialect: Dialect, replica: string): Promise<Readiness> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${READINESS_TIMEOUT_MS} ms`)), READINESS_TIMEOUT_MS);
  });
  let missing: string[];
  try {
    missing = await Promise.race([missingMigrations(db, dialect), timeout]);
  } catch (error) {
    return { ready: false, replica, reason: `the database is unreachable: ${(error as Error).message}` };
  } finally {
    clearTimeout(timer);
  }
  if (missing.length)
    return { ready: false, replica, reason: `the database schema is behind this manager: it lacks ${missing.join(', ')}` };
  return { ready: true, replica };
}
