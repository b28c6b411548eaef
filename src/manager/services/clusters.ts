import type { Kysely } from 'kysely';
import { z } from 'zod';
import { schedulingSchema, type SchedulingConfig } from '../../scheduler/config.js';
import type { ClusterRow, Database } from '../db/schema.js';
import { ManagerError, notFound } from '../errors.js';
import { recordAudit, type Actor } from './audit.js';
import { clusterScopesSchema, type ClusterScopes, type ScopedCluster } from './scopes.js';

export interface Cluster {
  id: number;
  name: string;
  config: SchedulingConfig;
  configVersion: number;
  scopes: ClusterScopes;
  isDefault: boolean;
  createdAt: string;
  updatedAt: string;
}

export function toCluster(row: ClusterRow): Cluster {
  return {
    id: row.id,
    name: row.name,
    // Parsed again so settings stored before a field existed come back with its default.
    config: schedulingSchema.parse(JSON.parse(row.config)),
    configVersion: row.config_version,
    scopes: clusterScopesSchema.parse(JSON.parse(row.scopes)),
    isDefault: row.is_default === 1,
    createdAt: new Date(row.created_at).toISOString(),
    updatedAt: new Date(row.updated_at).toISOString(),
  };
}

export async function listClusters(db: Kysely<Database>): Promise<Cluster[]> {
  return (await db.selectFrom('scheduler_clusters').selectAll().orderBy('id').execute()).map(toCluster);
}

export async function getCluster(db: Kysely<Database>, id: number): Promise<Cluster> {
  const row = await db.selectFrom('scheduler_clusters').selectAll().where('id', '=', id).executeTakeFirst();
  if (!row) throw notFound(`scheduler cluster ${id}`);
  return toCluster(row);
}

export async function clusterByName(db: Kysely<Database>, name: string): Promise<Cluster | undefined> {
  const row = await db.selectFrom('scheduler_clusters').selectAll().where('name', '=', name).executeTakeFirst();
  return row ? toCluster(row) : undefined;
}

export async function defaultCluster(db: Kysely<Database>): Promise<Cluster> {
  const row = await db.selectFrom('scheduler_clusters').selectAll().where('is_default', '=', 1).executeTakeFirst();
  if (!row) throw new ManagerError(500, 'no_default_cluster', 'no scheduler cluster is marked as the default');
  return toCluster(row);
}

export async function scopedClusters(db: Kysely<Database>): Promise<ScopedCluster[]> {
  return (await listClusters(db)).map((c) => ({ id: c.id, scopes: c.scopes, isDefault: c.isDefault }));
}

/** A version no cluster has had: schedulers compare versions only, and one may move between clusters. */
async function nextConfigVersion(db: Kysely<Database>): Promise<number> {
  const row = await db
    .selectFrom('scheduler_clusters')
    .select((eb) => eb.fn.max('config_version').as('max'))
    .executeTakeFirst();
  return Number(row?.max ?? 0) + 1;
}

async function assertNameFree(db: Kysely<Database>, name: string, exceptId?: number): Promise<void> {
  const existing = await db.selectFrom('scheduler_clusters').select('id').where('name', '=', name).executeTakeFirst();
  if (existing && existing.id !== exceptId) throw new ManagerError(409, 'conflict', `a scheduler cluster named "${name}" already exists`);
}

export interface ClusterInput {
  name: string;
  config?: Record<string, unknown>;
  scopes?: Partial<ClusterScopes>;
  isDefault?: boolean;
}

export async function createCluster(db: Kysely<Database>, actor: Actor, input: ClusterInput): Promise<Cluster> {
  const config = parseConfig(input.config ?? {});
  const scopes = clusterScopesSchema.parse(input.scopes ?? {});
  return db.transaction().execute(async (trx) => {
    await assertNameFree(trx, input.name);
    if (input.isDefault) await trx.updateTable('scheduler_clusters').set({ is_default: 0 }).execute();
    const now = Date.now();
    const row = await trx
      .insertInto('scheduler_clusters')
      .values({
        name: input.name,
        config: JSON.stringify(config),
        config_version: await nextConfigVersion(trx),
        scopes: JSON.stringify(scopes),
        is_default: input.isDefault ? 1 : 0,
        created_at: now,
        updated_at: now,
      })
      .returningAll()
      .executeTakeFirstOrThrow();
    const cluster = toCluster(row);
    await recordAudit(trx, actor, 'cluster.create', `cluster:${cluster.id}`, {
      name: cluster.name,
      config,
      scopes,
      isDefault: cluster.isDefault,
    });
    return cluster;
  });
}

export async function updateCluster(
  db: Kysely<Database>,
  actor: Actor,
  id: number,
  patch: { name?: string; scopes?: Partial<ClusterScopes>; isDefault?: boolean },
): Promise<Cluster> {
  return db.transaction().execute(async (trx) => {
    const current = await getCluster(trx, id);
    if (patch.isDefault === false && current.isDefault) {
      throw new ManagerError(409, 'conflict', 'isDefault: one cluster must stay the default; mark another cluster as the default instead');
    }
    if (patch.name !== undefined) await assertNameFree(trx, patch.name, id);
    if (patch.isDefault) await trx.updateTable('scheduler_clusters').set({ is_default: 0 }).where('id', '!=', id).execute();
    const scopes = patch.scopes ? clusterScopesSchema.parse({ ...current.scopes, ...patch.scopes }) : current.scopes;
    const row = await trx
      .updateTable('scheduler_clusters')
      .set({
        name: patch.name ?? current.name,
        scopes: JSON.stringify(scopes),
        is_default: (patch.isDefault ?? current.isDefault) ? 1 : 0,
        updated_at: Date.now(),
      })
      .where('id', '=', id)
      .returningAll()
      .executeTakeFirstOrThrow();
    await recordAudit(trx, actor, 'cluster.update', `cluster:${id}`, patch);
    return toCluster(row);
  });
}

/**
 * Changes some scheduling settings; the rest stay. Nested objects merge (a new `weights.pieces`
 * keeps the other weights), lists are replaced. The result must satisfy schedulingSchema.
 */
export async function updateClusterConfig(
  db: Kysely<Database>,
  actor: Actor,
  id: number,
  patch: Record<string, unknown>,
): Promise<Cluster> {
  return db.transaction().execute(async (trx) => {
    const current = await getCluster(trx, id);
    const config = parseConfig(mergeDeep(current.config, patch));
    const row = await trx
      .updateTable('scheduler_clusters')
      .set({ config: JSON.stringify(config), config_version: await nextConfigVersion(trx), updated_at: Date.now() })
      .where('id', '=', id)
      .returningAll()
      .executeTakeFirstOrThrow();
    await recordAudit(trx, actor, 'cluster.config', `cluster:${id}`, { changed: patch, version: row.config_version });
    return toCluster(row);
  });
}

export async function deleteCluster(db: Kysely<Database>, actor: Actor, id: number): Promise<void> {
  await db.transaction().execute(async (trx) => {
    const current = await getCluster(trx, id);
    if (current.isDefault)
      throw new ManagerError(409, 'conflict', `cluster ${id} is the default cluster; mark another one as the default first`);
    // Peers of the cluster move to the default at their next keep-alive; until then they stay listed there.
    const fallback = await defaultCluster(trx);
    await trx.updateTable('peers').set({ cluster_id: fallback.id }).where('cluster_id', '=', id).execute();
    await trx.deleteFrom('schedulers').where('cluster_id', '=', id).execute();
    await trx.deleteFrom('scheduler_clusters').where('id', '=', id).execute();
    await recordAudit(trx, actor, 'cluster.delete', `cluster:${id}`, { name: current.name });
  });
}

/** schedulingSchema, with its issues raised as one 400 naming the fields under `config`. */
function parseConfig(value: unknown): SchedulingConfig {
  const result = schedulingSchema.safeParse(value);
  if (!result.success) throw new ManagerError(400, 'invalid_request', describeIssues(result.error, 'config'));
  return result.data;
}

export function describeIssues(error: z.ZodError, root: string): string {
  return error.issues
    .map((issue) => {
      const path = [root, ...issue.path.map(String)].filter(Boolean).join('.');
      if (issue.code === 'unrecognized_keys') return `${issue.keys.map((k) => (path ? `${path}.${k}` : k)).join(', ')}: unknown field`;
      return `${path || '(body)'}: ${issue.message}`;
    })
    .join('; ');
}

function mergeDeep(base: Record<string, unknown>, patch: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = { ...base };
  for (const [key, value] of Object.entries(patch)) {
    const current = out[key];
    const plain = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
    out[key] = plain(current) && plain(value) ? mergeDeep(current, value) : value;
  }
  return out;
}
