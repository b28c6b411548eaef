import type { Generated, Selectable } from 'kysely';

/*
 * The tables as Kysely sees them. Portable column types only, so one query layer serves SQLite
 * and PostgreSQL: JSON is stored as text, booleans as 0/1 integers, times as epoch milliseconds.
 */

export interface ClusterTable {
  id: Generated<number>;
  name: string;
  /** schedulingSchema JSON. */
  config: string;
  /** Bumped (globally, across clusters) on every config change; schedulers compare it. */
  config_version: number;
  /** ClusterScopes JSON. */
  scopes: string;
  is_default: number;
  created_at: number;
  updated_at: number;
}

export interface SchedulerTable {
  id: Generated<number>;
  cluster_id: number;
  hostname: string;
  ip: string;
  port: number;
  state: 'active' | 'inactive';
  last_keepalive: number;
  created_at: number;
}

export interface PeerTable {
  id: Generated<number>;
  cluster_id: number;
  host_id: string;
  hostname: string;
  ip: string;
  upload_port: number;
  mirror_url: string;
  /** Record<string,string> JSON. */
  labels: string;
  type: 'normal' | 'seed';
  state: 'active' | 'inactive';
  last_keepalive: number;
  created_at: number;
}

/** What each peer last reported about the tasks it holds: the source of "bytes from peers vs origin". */
export interface PeerTaskTable {
  host_id: string;
  digest: string;
  size: number;
  complete: number;
  bytes_peer: number;
  bytes_seed: number;
  bytes_origin: number;
  updated_at: number;
}

export type JobState = 'pending' | 'running' | 'succeeded' | 'failed';

export interface JobTable {
  id: Generated<number>;
  type: string;
  state: JobState;
  args: string;
  /** What the job resolved as it started (manifest digest, layers, peers); the bytes are added when it ends. */
  result: string | null;
  error: string | null;
  created_by: string;
  created_at: number;
  updated_at: number;
  /** The manager replica that holds the job (runs it, or ran it last). */
  owner: string | null;
  /** The owner's lease, in the database's clock (epoch ms); 0 for a job nobody holds. */
  lease_expires_at: Generated<number>;
  /** How many times another replica (or a restarted one) took the job over. */
  takeovers: Generated<number>;
}

export interface JobTaskTable {
  id: Generated<number>;
  job_id: number;
  digest: string;
  size: number;
  host_id: string;
  /** The peer's upload address when the job started (ip:port). */
  peer_address: string;
  state: JobState;
  bytes: number;
  error: string | null;
  updated_at: number;
}

export type Role = 'admin' | 'read-only';

export interface UserTable {
  id: Generated<number>;
  name: string;
  role: Role;
  created_at: number;
}

export interface TokenTable {
  id: Generated<number>;
  user_id: number;
  name: string;
  /** sha256 hex of the token; the token itself is shown once and never stored. */
  hash: string;
  created_at: number;
  expires_at: number | null;
}

export interface AuditTable {
  id: Generated<number>;
  actor: string;
  action: string;
  target: string;
  detail: string;
  at: number;
}

export interface Database {
  scheduler_clusters: ClusterTable;
  schedulers: SchedulerTable;
  peers: PeerTable;
  peer_tasks: PeerTaskTable;
  jobs: JobTable;
  job_tasks: JobTaskTable;
  users: UserTable;
  tokens: TokenTable;
  audit_log: AuditTable;
}

export type ClusterRow = Selectable<ClusterTable>;
export type SchedulerRow = Selectable<SchedulerTable>;
export type PeerRow = Selectable<PeerTable>;
export type JobRow = Selectable<JobTable>;
export type JobTaskRow = Selectable<JobTaskTable>;
export type UserRow = Selectable<UserTable>;
export type TokenRow = Selectable<TokenTable>;
export type AuditRow = Selectable<AuditTable>;
