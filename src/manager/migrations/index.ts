import { Migrator, type Kysely, type Migration, type MigrationProvider } from 'kysely';
import type { Dialect } from '../db/connect.js';
import type { Database } from '../db/schema.js';
import { initial } from './001-initial.js';
import { jobLeases } from './002-job-leases.js';

/**
 * The versioned migrations, in code (nothing to find on disk at run time). Names sort in the
 * order they apply; a migration, once released, is never edited: add the next one instead.
 */
function migrations(dialect: Dialect): Record<string, Migration> {
  return {
    '001-initial': initial(dialect),
    '002-job-leases': jobLeases,
  };
}

class InCodeProvider implements MigrationProvider {
  constructor(private readonly dialect: Dialect) {}
  async getMigrations(): Promise<Record<string, Migration>> {
    return migrations(this.dialect);
  }
}

function migrator(db: Kysely<Database>, dialect: Dialect): Migrator {
  return new Migrator({
    db,
    provider: new InCodeProvider(dialect),
    migrationTableName: 'starling_migrations',
    migrationLockTableName: 'starling_migrations_lock',
  });
}

/** Brings the database to the latest schema; returns the names applied now. */
export async function migrateToLatest(db: Kysely<Database>, dialect: Dialect): Promise<string[]> {
  const { error, results } = await migrator(db, dialect).migrateToLatest();
  if (error) {
    const failed = results?.find((r) => r.status === 'Error')?.migrationName;
    throw new Error(`database migration ${failed ?? ''} failed: ${(error as Error).message}`);
  }
  return (results ?? []).filter((r) => r.status === 'Success').map((r) => r.migrationName);
}

/** The migrations this build needs that the database has not had (none when its schema is current). Reads only. */
export async function missingMigrations(db: Kysely<Database>, dialect: Dialect): Promise<string[]> {
  return (await migrator(db, dialect).getMigrations()).filter((m) => m.executedAt === undefined).map((m) => m.name);
}
