import type { Kysely } from 'kysely';
import type { Database } from '../db/schema.js';

export interface Overview {
  clusters: number;
  schedulers: { active: number; inactive: number };
  peers: { active: number; inactive: number; seeds: number };
  jobs: { pending: number; running: number; succeeded: number; failed: number };
  tasks: number;
  /**
   * Bytes the peers say they got, by source, summed over the tasks they hold now: when P2P
   * works, fromPeers + fromSeeds dwarfs fromOrigin, and p2pRatio (their share) nears 1.
   */
  bytes: { fromPeers: number; fromSeeds: number; fromOrigin: number; p2pRatio: number | null };
}

export async function overview(db: Kysely<Database>): Promise<Overview> {
  const [clusters, schedulers, peers, seeds, jobs, tasks, bytes] = await Promise.all([
    db
      .selectFrom('scheduler_clusters')
      .select((eb) => eb.fn.countAll<number>().as('n'))
      .executeTakeFirstOrThrow(),
    db
      .selectFrom('schedulers')
      .select((eb) => ['state', eb.fn.countAll<number>().as('n')])
      .groupBy('state')
      .execute(),
    db
      .selectFrom('peers')
      .select((eb) => ['state', eb.fn.countAll<number>().as('n')])
      .groupBy('state')
      .execute(),
    db
      .selectFrom('peers')
      .select((eb) => eb.fn.countAll<number>().as('n'))
      .where('type', '=', 'seed')
      .where('state', '=', 'active')
      .executeTakeFirstOrThrow(),
    db
      .selectFrom('jobs')
      .select((eb) => ['state', eb.fn.countAll<number>().as('n')])
      .groupBy('state')
      .execute(),
    db
      .selectFrom('peer_tasks')
      .select((eb) => eb.fn.count<number>('digest').distinct().as('n'))
      .executeTakeFirstOrThrow(),
    db
      .selectFrom('peer_tasks')
      .select((eb) => [
        eb.fn.sum<number>('bytes_peer').as('peer'),
        eb.fn.sum<number>('bytes_seed').as('seed'),
        eb.fn.sum<number>('bytes_origin').as('origin'),
      ])
      .executeTakeFirstOrThrow(),
  ]);
  const byState = (rows: Array<{ state: string; n: number }>, state: string) => Number(rows.find((r) => r.state === state)?.n ?? 0);
  const fromPeers = Number(bytes.peer ?? 0);
  const fromSeeds = Number(bytes.seed ?? 0);
  const fromOrigin = Number(bytes.origin ?? 0);
  const total = fromPeers + fromSeeds + fromOrigin;
  return {
    clusters: Number(clusters.n),
    schedulers: { active: byState(schedulers, 'active'), inactive: byState(schedulers, 'inactive') },
    peers: { active: byState(peers, 'active'), inactive: byState(peers, 'inactive'), seeds: Number(seeds.n) },
    jobs: {
      pending: byState(jobs, 'pending'),
      running: byState(jobs, 'running'),
      succeeded: byState(jobs, 'succeeded'),
      failed: byState(jobs, 'failed'),
    },
    tasks: Number(tasks.n),
    bytes: { fromPeers, fromSeeds, fromOrigin, p2pRatio: total > 0 ? (fromPeers + fromSeeds) / total : null },
  };
}
