import type { Kysely, Migration } from 'kysely';

/**
 * Jobs get an owner: the manager replica running the job holds it by a lease it renews. A job
 * whose lease ran out (its replica died or lost the database) is taken over by another replica.
 * Jobs left pending or running by an older manager have no lease (0): the first replica to look
 * takes them over.
 */
export const jobLeases: Migration = {
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- Kysely's own advice for migrations (as 001)
  async up(db: Kysely<any>): Promise<void> {
    await db.schema.alterTable('jobs').addColumn('owner', 'text').execute();
    await db.schema
      .alterTable('jobs')
      .addColumn('lease_expires_at', 'bigint', (c) => c.notNull().defaultTo(0))
      .execute();
    await db.schema
      .alterTable('jobs')
      .addColumn('takeovers', 'integer', (c) => c.notNull().defaultTo(0))
      .execute();
    // Every replica looks for unfinished jobs with a run-out lease every few seconds.
    await db.schema.createIndex('jobs_state').on('jobs').column('state').execute();
  },
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- as up()
  async down(db: Kysely<any>): Promise<void> {
    await db.schema.dropIndex('jobs_state').execute();
    for (const column of ['takeovers', 'lease_expires_at', 'owner']) await db.schema.alterTable('jobs').dropColumn(column).execute();
  },
};
