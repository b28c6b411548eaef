import type { Kysely } from 'kysely';
import { formatHostPort } from '../../common/net.js';
import type { SchedulingConfig } from '../../scheduler/config.js';
import type { Database, PeerRow, SchedulerRow } from '../db/schema.js';
import { ManagerError } from '../errors.js';
import { recordAudit } from './audit.js';
import { clusterByName, defaultCluster, scopedClusters } from './clusters.js';
import { matchCluster } from './scopes.js';
import type { PeerKeepalive, SchedulerKeepalive } from '../../rpc/manager-api.js';

/*
 * Schedulers and peers keep themselves registered by calling every few seconds; whoever stays
 * silent past the liveness window is inactive. Only changes of membership (a new member, going
 * inactive, coming back) reach the audit log: the keep-alives themselves would drown it.
 */

export async function schedulerKeepalive(
  db: Kysely<Database>,
  input: SchedulerKeepalive,
): Promise<{ clusterId: number; config: SchedulingConfig; configVersion: number }> {
  return db.transaction().execute(async (trx) => {
    const cluster = input.clusterName ? await clusterByName(trx, input.clusterName) : await defaultCluster(trx);
    if (!cluster) throw new ManagerError(404, 'cluster_not_found', `clusterName: no scheduler cluster is named "${input.clusterName}"`);
    const now = Date.now();
    const address = formatHostPort({ host: input.ip, port: input.port });
    const before = await trx
      .selectFrom('schedulers')
      .select(['state', 'cluster_id'])
      .where('ip', '=', input.ip)
      .where('port', '=', input.port)
      .executeTakeFirst();
    await trx
      .insertInto('schedulers')
      .values({
        cluster_id: cluster.id,
        hostname: input.hostname,
        ip: input.ip,
        port: input.port,
        state: 'active',
        last_keepalive: now,
        created_at: now,
      })
      .onConflict((oc) =>
        oc.columns(['ip', 'port']).doUpdateSet({ cluster_id: cluster.id, hostname: input.hostname, state: 'active', last_keepalive: now }),
      )
      .execute();
    if (!before)
      await recordAudit(trx, `scheduler:${address}`, 'scheduler.register', `scheduler:${address}`, {
        hostname: input.hostname,
        clusterId: cluster.id,
      });
    else if (before.state !== 'active')
      await recordAudit(trx, `scheduler:${address}`, 'scheduler.active', `scheduler:${address}`, { clusterId: cluster.id });
    return { clusterId: cluster.id, config: cluster.config, configVersion: cluster.configVersion };
  });
}

/** Registers or refreshes a peer and answers with the active schedulers of the cluster its scopes pick. */
export async function peerKeepalive(
  db: Kysely<Database>,
  input: PeerKeepalive,
  livenessMs: number,
): Promise<{ clusterId: number; schedulers: string[] }> {
  const clusterId = matchCluster(await scopedClusters(db), input);
  if (clusterId === undefined) throw new ManagerError(500, 'no_default_cluster', 'no scheduler cluster is marked as the default');
  const now = Date.now();
  await db.transaction().execute(async (trx) => {
    const before = await trx.selectFrom('peers').select(['state']).where('host_id', '=', input.hostId).executeTakeFirst();
    const values = {
      cluster_id: clusterId,
      hostname: input.hostname,
      ip: input.ip,
      upload_port: input.uploadPort,
      mirror_url: input.mirrorUrl,
      labels: JSON.stringify(input.labels),
      type: input.seed ? ('seed' as const) : ('normal' as const),
      state: 'active' as const,
      last_keepalive: now,
    };
    await trx
      .insertInto('peers')
      .values({ ...values, host_id: input.hostId, created_at: now })
      .onConflict((oc) => oc.column('host_id').doUpdateSet(values))
      .execute();
    if (input.tasks) {
      // The report is the peer's whole current holding: replace what it said last time.
      await trx.deleteFrom('peer_tasks').where('host_id', '=', input.hostId).execute();
      const rows = input.tasks.map((t) => ({
        host_id: input.hostId,
        digest: t.digest,
        size: t.size,
        complete: t.complete ? 1 : 0,
        bytes_peer: t.bytesFrom.peer,
        bytes_seed: t.bytesFrom.seed,
        bytes_origin: t.bytesFrom.origin,
        updated_at: now,
      }));
      // Kept under both databases' limits on bound parameters per statement.
      for (let i = 0; i < rows.length; i += 500)
        await trx
          .insertInto('peer_tasks')
          .values(rows.slice(i, i + 500))
          .execute();
    }
    const actor = `peer:${input.hostId}`;
    if (!before)
      await recordAudit(trx, actor, 'peer.register', actor, { hostname: input.hostname, ip: input.ip, seed: input.seed, clusterId });
    else if (before.state !== 'active') await recordAudit(trx, actor, 'peer.active', actor, { clusterId });
  });
  const schedulers = await db
    .selectFrom('schedulers')
    .select(['ip', 'port'])
    .where('cluster_id', '=', clusterId)
    .where('state', '=', 'active')
    .where('last_keepalive', '>=', now - livenessMs)
    .orderBy('id')
    .execute();
  return { clusterId, schedulers: schedulers.map((s) => formatHostPort({ host: s.ip, port: s.port })) };
}

/**
 * Marks schedulers and peers silent for longer than `livenessMs` inactive; returns how many changed.
 * Every replica runs this: the update itself picks the rows (and PostgreSQL re-checks a row another
 * replica changed first), so each change is made, and audited, once.
 */
export async function markSilentInactive(db: Kysely<Database>, livenessMs: number): Promise<{ schedulers: number; peers: number }> {
  const cutoff = Date.now() - livenessMs;
  return db.transaction().execute(async (trx) => {
    const silentSchedulers = await trx
      .updateTable('schedulers')
      .set({ state: 'inactive' })
      .where('state', '=', 'active')
      .where('last_keepalive', '<', cutoff)
      .returning(['ip', 'port', 'last_keepalive'])
      .execute();
    const silentPeers = await trx
      .updateTable('peers')
      .set({ state: 'inactive' })
      .where('state', '=', 'active')
      .where('last_keepalive', '<', cutoff)
      .returning(['host_id', 'last_keepalive'])
      .execute();
    for (const s of silentSchedulers) {
      const address = formatHostPort({ host: s.ip, port: s.port });
      await recordAudit(trx, 'system', 'scheduler.inactive', `scheduler:${address}`, {
        lastKeepalive: new Date(s.last_keepalive).toISOString(),
      });
    }
    for (const p of silentPeers) {
      await recordAudit(trx, 'system', 'peer.inactive', `peer:${p.host_id}`, { lastKeepalive: new Date(p.last_keepalive).toISOString() });
    }
    return { schedulers: silentSchedulers.length, peers: silentPeers.length };
  });
}

export interface SchedulerView {
  id: number;
  clusterId: number;
  hostname: string;
  ip: string;
  port: number;
  address: string;
  state: 'active' | 'inactive';
  lastKeepalive: string;
  createdAt: string;
}

function toScheduler(row: SchedulerRow): SchedulerView {
  return {
    id: row.id,
    clusterId: row.cluster_id,
    hostname: row.hostname,
    ip: row.ip,
    port: row.port,
    address: formatHostPort({ host: row.ip, port: row.port }),
    state: row.state,
    lastKeepalive: new Date(row.last_keepalive).toISOString(),
    createdAt: new Date(row.created_at).toISOString(),
  };
}

export async function listSchedulers(
  db: Kysely<Database>,
  filter: { clusterId?: number; state?: 'active' | 'inactive' },
): Promise<SchedulerView[]> {
  let query = db.selectFrom('schedulers').selectAll().orderBy('id');
  if (filter.clusterId !== undefined) query = query.where('cluster_id', '=', filter.clusterId);
  if (filter.state) query = query.where('state', '=', filter.state);
  return (await query.execute()).map(toScheduler);
}

export interface PeerView {
  id: number;
  clusterId: number;
  hostId: string;
  hostname: string;
  ip: string;
  uploadPort: number;
  mirrorUrl: string;
  labels: Record<string, string>;
  type: 'normal' | 'seed';
  state: 'active' | 'inactive';
  lastKeepalive: string;
  /** Seconds since the last keep-alive: the console's health column. */
  silentForSeconds: number;
  tasks: { count: number; complete: number; bytesFromPeers: number; bytesFromSeeds: number; bytesFromOrigin: number };
  createdAt: string;
}

export async function listPeers(
  db: Kysely<Database>,
  filter: { clusterId?: number; state?: 'active' | 'inactive'; type?: 'normal' | 'seed'; zone?: string },
): Promise<PeerView[]> {
  let query = db.selectFrom('peers').selectAll().orderBy('id');
  if (filter.clusterId !== undefined) query = query.where('cluster_id', '=', filter.clusterId);
  if (filter.state) query = query.where('state', '=', filter.state);
  if (filter.type) query = query.where('type', '=', filter.type);
  const rows = await query.execute();
  const totals = await db
    .selectFrom('peer_tasks')
    .select((eb) => [
      'host_id',
      eb.fn.countAll<number>().as('count'),
      eb.fn.sum<number>('complete').as('complete'),
      eb.fn.sum<number>('bytes_peer').as('peer'),
      eb.fn.sum<number>('bytes_seed').as('seed'),
      eb.fn.sum<number>('bytes_origin').as('origin'),
    ])
    .groupBy('host_id')
    .execute();
  const byHost = new Map(totals.map((t) => [t.host_id, t]));
  const now = Date.now();
  return rows
    .map((row) => toPeer(row, byHost.get(row.host_id), now))
    .filter((peer) => filter.zone === undefined || peer.labels.zone === filter.zone);
}

function toPeer(
  row: PeerRow,
  totals: { count: number; complete: number; peer: number; seed: number; origin: number } | undefined,
  now: number,
): PeerView {
  return {
    id: row.id,
    clusterId: row.cluster_id,
    hostId: row.host_id,
    hostname: row.hostname,
    ip: row.ip,
    uploadPort: row.upload_port,
    mirrorUrl: row.mirror_url,
    labels: JSON.parse(row.labels) as Record<string, string>,
    type: row.type,
    state: row.state,
    lastKeepalive: new Date(row.last_keepalive).toISOString(),
    silentForSeconds: Math.max(0, Math.round((now - row.last_keepalive) / 1000)),
    tasks: {
      count: Number(totals?.count ?? 0),
      complete: Number(totals?.complete ?? 0),
      bytesFromPeers: Number(totals?.peer ?? 0),
      bytesFromSeeds: Number(totals?.seed ?? 0),
      bytesFromOrigin: Number(totals?.origin ?? 0),
    },
    createdAt: new Date(row.created_at).toISOString(),
  };
}

/** Active peers (and recently heard from) that a preheat scope names. */
export async function peersInScope(db: Kysely<Database>, scope: string, livenessMs: number): Promise<PeerRow[]> {
  let query = db
    .selectFrom('peers')
    .selectAll()
    .where('state', '=', 'active')
    .where('last_keepalive', '>=', Date.now() - livenessMs)
    .orderBy('id');
  if (scope === 'seeds') query = query.where('type', '=', 'seed');
  const rows = await query.execute();
  if (!scope.startsWith('zone:')) return rows;
  const zone = scope.slice('zone:'.length);
  return rows.filter((row) => (JSON.parse(row.labels) as Record<string, string>).zone === zone);
}

export interface TaskView {
  digest: string;
  size: number;
  peers: Array<{ hostId: string; complete: boolean }>;
  bytesFromPeers: number;
  bytesFromSeeds: number;
  bytesFromOrigin: number;
}

/** Tasks the peers reported, with who holds them: the console's "is P2P working?" per blob. */
export async function listTasks(db: Kysely<Database>, limit: number): Promise<TaskView[]> {
  const rows = await db.selectFrom('peer_tasks').selectAll().orderBy('digest').orderBy('host_id').execute();
  const tasks = new Map<string, TaskView>();
  for (const row of rows) {
    let task = tasks.get(row.digest);
    if (!task) {
      if (tasks.size >= limit) break;
      task = { digest: row.digest, size: row.size, peers: [], bytesFromPeers: 0, bytesFromSeeds: 0, bytesFromOrigin: 0 };
      tasks.set(row.digest, task);
    }
    task.peers.push({ hostId: row.host_id, complete: row.complete === 1 });
    task.bytesFromPeers += row.bytes_peer;
    task.bytesFromSeeds += row.bytes_seed;
    task.bytesFromOrigin += row.bytes_origin;
  }
  return [...tasks.values()];
}
