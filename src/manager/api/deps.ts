import type { Kysely } from 'kysely';
import type { ClusterTls } from '../../common/tls.js';
import type { Registry } from 'prom-client';
import type { Database } from '../db/schema.js';
import type { JobEngine } from '../services/jobs.js';
import type { Readiness } from '../services/readiness.js';
import type { ClusterToken } from '../../common/token.js';

/** What route modules need from the running manager. */
export interface ApiDeps {
  db: Kysely<Database>;
  jobs: JobEngine;
  metrics: Registry;
  /** Schedulers and peers silent longer than this are inactive. */
  livenessMs: number;
  clusterToken: ClusterToken;
  /** HTTPS with the cluster's certificate, when the cluster uses TLS. */
  tls?: ClusterTls;
  /** Built web console, served at / when present. */
  consoleDir: string;
  /** Whether this replica can serve (the database answers, its schema is current). */
  readiness: () => Promise<Readiness>;
}
