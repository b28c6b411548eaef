import type { Kysely } from 'kysely';
import { Counter, Gauge, type Registry } from 'prom-client';
import type { Database } from './db/schema.js';
import { overview, type Overview } from './services/overview.js';

export interface ManagerMetrics {
  requests: Counter<'method' | 'route' | 'status'>;
  jobsFinished: Counter<'state'>;
}

/**
 * The manager's own numbers. Membership and bytes are read from the database at scrape time,
 * so every manager replica sharing a PostgreSQL database reports the same cluster-wide values.
 */
export function createManagerMetrics(registry: Registry, db: Kysely<Database>): ManagerMetrics {
  // prom-client collects all metrics of a scrape at once: they share one database read.
  let cached: { at: number; value: Promise<Overview> } | undefined;
  const snapshot = () => {
    if (!cached || Date.now() - cached.at > 500) cached = { at: Date.now(), value: overview(db) };
    return cached.value;
  };
  const gauge = (name: string, help: string, labelNames: string[], fill: (g: Gauge<string>, o: Overview) => void) =>
    new Gauge({
      name,
      help,
      labelNames,
      registers: [registry],
      async collect() {
        fill(this, await snapshot());
      },
    });

  gauge('starling_manager_scheduler_clusters', 'Scheduler clusters', [], (g, o) => g.set(o.clusters));
  gauge('starling_manager_schedulers', 'Registered schedulers by state', ['state'], (g, o) => {
    g.set({ state: 'active' }, o.schedulers.active);
    g.set({ state: 'inactive' }, o.schedulers.inactive);
  });
  gauge('starling_manager_peers', 'Registered peers by state', ['state'], (g, o) => {
    g.set({ state: 'active' }, o.peers.active);
    g.set({ state: 'inactive' }, o.peers.inactive);
  });
  gauge('starling_manager_seed_peers_active', 'Active seed peers', [], (g, o) => g.set(o.peers.seeds));
  gauge('starling_manager_jobs', 'Jobs by state', ['state'], (g, o) => {
    for (const [state, n] of Object.entries(o.jobs)) g.set({ state }, n);
  });
  gauge(
    'starling_manager_peer_reported_bytes',
    'Bytes the peers report for the tasks they hold, by where they came from',
    ['source'],
    (g, o) => {
      g.set({ source: 'peer' }, o.bytes.fromPeers);
      g.set({ source: 'seed' }, o.bytes.fromSeeds);
      g.set({ source: 'origin' }, o.bytes.fromOrigin);
    },
  );
  return {
    requests: new Counter({
      name: 'starling_manager_http_requests_total',
      help: 'API requests by route and status',
      labelNames: ['method', 'route', 'status'],
      registers: [registry],
    }),
    jobsFinished: new Counter({
      name: 'starling_manager_jobs_finished_total',
      help: 'Jobs this process saw finish, by outcome',
      labelNames: ['state'],
      registers: [registry],
    }),
  };
}
