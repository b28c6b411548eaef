import type { Kysely, Migration } from 'kysely';
import { defaultScheduling } from '../../scheduler/config.js';
import type { Dialect } from '../db/connect.js';

/** The first schema: every table the manager keeps, and the default scheduler cluster. */
export function initial(dialect: Dialect): Migration {
  // The only dialect difference: how an auto-numbered key is spelled.
  const id = dialect === 'postgres' ? ('serial' as const) : ('integer' as const);
  return {
    // A migration sees the tables as they were when it was written, not today's Database type.
    // eslint-disable-next-line @typescript-eslint/no-explicit-any -- Kysely's own advice for migrations
    async up(db: Kysely<any>): Promise<void> {
      await db.schema
        .createTable('scheduler_clusters')
        .addColumn('id', id, (c) => (dialect === 'postgres' ? c.primaryKey() : c.primaryKey().autoIncrement()))
        .addColumn('name', 'text', (c) => c.notNull().unique())
        .addColumn('config', 'text', (c) => c.notNull())
        .addColumn('config_version', 'bigint', (c) => c.notNull())
        .addColumn('scopes', 'text', (c) => c.notNull())
        .addColumn('is_default', 'integer', (c) => c.notNull().defaultTo(0))
        .addColumn('created_at', 'bigint', (c) => c.notNull())
        .addColumn('updated_at', 'bigint', (c) => c.notNull())
        .execute();

      await db.schema
        .createTable('schedulers')
        .addColumn('id', id, (c) => (dialect === 'postgres' ? c.primaryKey() : c.primaryKey().autoIncrement()))
        .addColumn('cluster_id', 'integer', (c) => c.notNull().references('scheduler_clusters.id').onDelete('cascade'))
        .addColumn('hostname', 'text', (c) => c.notNull())
        .addColumn('ip', 'text', (c) => c.notNull())
        .addColumn('port', 'integer', (c) => c.notNull())
        .addColumn('state', 'text', (c) => c.notNull())
        .addColumn('last_keepalive', 'bigint', (c) => c.notNull())
        .addColumn('created_at', 'bigint', (c) => c.notNull())
        .addUniqueConstraint('schedulers_address', ['ip', 'port'])
        .execute();

      await db.schema
        .createTable('peers')
        .addColumn('id', id, (c) => (dialect === 'postgres' ? c.primaryKey() : c.primaryKey().autoIncrement()))
        .addColumn('cluster_id', 'integer', (c) => c.notNull().references('scheduler_clusters.id').onDelete('cascade'))
        .addColumn('host_id', 'text', (c) => c.notNull().unique())
        .addColumn('hostname', 'text', (c) => c.notNull())
        .addColumn('ip', 'text', (c) => c.notNull())
        .addColumn('upload_port', 'integer', (c) => c.notNull())
        .addColumn('mirror_url', 'text', (c) => c.notNull())
        .addColumn('labels', 'text', (c) => c.notNull())
        .addColumn('type', 'text', (c) => c.notNull())
        .addColumn('state', 'text', (c) => c.notNull())
        .addColumn('last_keepalive', 'bigint', (c) => c.notNull())
        .addColumn('created_at', 'bigint', (c) => c.notNull())
        .execute();

      await db.schema
        .createTable('peer_tasks')
        .addColumn('host_id', 'text', (c) => c.notNull().references('peers.host_id').onDelete('cascade'))
        .addColumn('digest', 'text', (c) => c.notNull())
        .addColumn('size', 'bigint', (c) => c.notNull())
        .addColumn('complete', 'integer', (c) => c.notNull())
        .addColumn('bytes_peer', 'bigint', (c) => c.notNull())
        .addColumn('bytes_seed', 'bigint', (c) => c.notNull())
        .addColumn('bytes_origin', 'bigint', (c) => c.notNull())
        .addColumn('updated_at', 'bigint', (c) => c.notNull())
        .addPrimaryKeyConstraint('peer_tasks_pk', ['host_id', 'digest'])
        .execute();
      await db.schema.createIndex('peer_tasks_digest').on('peer_tasks').column('digest').execute();

      await db.schema
        .createTable('jobs')
        .addColumn('id', id, (c) => (dialect === 'postgres' ? c.primaryKey() : c.primaryKey().autoIncrement()))
        .addColumn('type', 'text', (c) => c.notNull())
        .addColumn('state', 'text', (c) => c.notNull())
        .addColumn('args', 'text', (c) => c.notNull())
        .addColumn('result', 'text')
        .addColumn('error', 'text')
        .addColumn('created_by', 'text', (c) => c.notNull())
        .addColumn('created_at', 'bigint', (c) => c.notNull())
        .addColumn('updated_at', 'bigint', (c) => c.notNull())
        .execute();

      await db.schema
        .createTable('job_tasks')
        .addColumn('id', id, (c) => (dialect === 'postgres' ? c.primaryKey() : c.primaryKey().autoIncrement()))
        .addColumn('job_id', 'integer', (c) => c.notNull().references('jobs.id').onDelete('cascade'))
        .addColumn('digest', 'text', (c) => c.notNull())
        .addColumn('size', 'bigint', (c) => c.notNull())
        .addColumn('host_id', 'text', (c) => c.notNull())
        .addColumn('peer_address', 'text', (c) => c.notNull())
        .addColumn('state', 'text', (c) => c.notNull())
        .addColumn('bytes', 'bigint', (c) => c.notNull())
        .addColumn('error', 'text')
        .addColumn('updated_at', 'bigint', (c) => c.notNull())
        .execute();
      await db.schema.createIndex('job_tasks_job').on('job_tasks').column('job_id').execute();

      await db.schema
        .createTable('users')
        .addColumn('id', id, (c) => (dialect === 'postgres' ? c.primaryKey() : c.primaryKey().autoIncrement()))
        .addColumn('name', 'text', (c) => c.notNull().unique())
        .addColumn('role', 'text', (c) => c.notNull())
        .addColumn('created_at', 'bigint', (c) => c.notNull())
        .execute();

      await db.schema
        .createTable('tokens')
        .addColumn('id', id, (c) => (dialect === 'postgres' ? c.primaryKey() : c.primaryKey().autoIncrement()))
        .addColumn('user_id', 'integer', (c) => c.notNull().references('users.id').onDelete('cascade'))
        .addColumn('name', 'text', (c) => c.notNull())
        .addColumn('hash', 'text', (c) => c.notNull().unique())
        .addColumn('created_at', 'bigint', (c) => c.notNull())
        .addColumn('expires_at', 'bigint')
        .execute();

      await db.schema
        .createTable('audit_log')
        .addColumn('id', id, (c) => (dialect === 'postgres' ? c.primaryKey() : c.primaryKey().autoIncrement()))
        .addColumn('actor', 'text', (c) => c.notNull())
        .addColumn('action', 'text', (c) => c.notNull())
        .addColumn('target', 'text', (c) => c.notNull())
        .addColumn('detail', 'text', (c) => c.notNull())
        .addColumn('at', 'bigint', (c) => c.notNull())
        .execute();

      // Every peer and scheduler lands somewhere: the default cluster takes whoever no scope matches.
      const now = Date.now();
      await db
        .insertInto('scheduler_clusters')
        .values({
          name: 'default',
          config: JSON.stringify(defaultScheduling()),
          config_version: 1,
          scopes: JSON.stringify({ zones: [], cidrs: [], hostnames: [] }),
          is_default: 1,
          created_at: now,
          updated_at: now,
        })
        .execute();
    },
    // eslint-disable-next-line @typescript-eslint/no-explicit-any -- as up()
    async down(db: Kysely<any>): Promise<void> {
      for (const table of [
        'audit_log',
        'tokens',
        'users',
        'job_tasks',
        'jobs',
        'peer_tasks',
        'peers',
        'schedulers',
        'scheduler_clusters',
      ]) {
        await db.schema.dropTable(table).execute();
      }
    },
  };
}
