import type { Kysely } from 'kysely';
import { Agent } from 'undici';
import { clientTlsOptions, type ClientTls } from '../../common/tls.js';
import { formatHostPort } from '../../common/net.js';
import type { Logger } from '../../common/log.js';
import { parsePlatform } from '../../convert/platform.js';
import { parseImageReference } from '../../oci/reference.js';
import type { Dialect } from '../db/connect.js';
import type { Database, JobRow, JobState, JobTaskRow } from '../db/schema.js';
import { ManagerError, notFound } from '../errors.js';
import { recordAudit, type Actor } from './audit.js';
import { isLoopbackRegistry, resolveImage, resolveOrigin } from './images.js';
import { HeldLease, JobLeases, type TakenOver } from './job-leases.js';
import { peersInScope } from './members.js';
import { CREDENTIALS_NEED_TLS, PreheatRun, type PreheatPlan, type PreheatRunOptions } from './preheat-run.js';
import type { ClusterToken } from '../../common/token.js';

/*
 * Preheat jobs: created through any manager replica, run by one at a time (job-leases.ts). The
 * replica that creates a job runs it; a job whose replica died is taken over by the first replica
 * that sees its lease run out, and goes on from its rows (preheat-run.ts).
 */

export interface PreheatRequest {
  type: 'preheat';
  image: string;
  platform: string;
  scope: string;
  credentials?: { username: string; password: string };
  insecure?: boolean;
}

export interface JobEngineOptions {
  pollMs: number;
  timeoutMs: number;
  concurrency: number;
  /** Peers silent longer than this are not targets. */
  livenessMs: number;
  insecureRegistries: string[];
  clusterToken?: ClusterToken;
  /** Reach the peers' upload ports over TLS (a preheat carries the job's registry credentials). */
  tls?: ClientTls;
  /** This replica's name in the jobs it holds: unique per process. */
  replica: string;
  /** How long a job stays this replica's without a renewal. */
  leaseMs: number;
  /** Told of every job this replica ends, for metrics. */
  onFinished?: (state: JobState) => void;
}

export interface LayerProgress {
  digest: string;
  size: number;
  peers: number;
  succeeded: number;
  failed: number;
  bytes: number;
}

export interface JobTaskView {
  digest: string;
  hostId: string;
  peerAddress: string;
  state: JobState;
  size: number;
  bytes: number;
  error: string | null;
  updatedAt: string;
}

export interface JobView {
  id: number;
  type: string;
  state: JobState;
  args: Record<string, unknown>;
  result: Record<string, unknown> | null;
  error: string | null;
  createdBy: string;
  createdAt: string;
  updatedAt: string;
  /** The replica that runs the job (or ran it last). */
  owner: string | null;
  /** How many times another replica took the job over from one that died or stopped. */
  takeovers: number;
  progress: { tasks: number; pending: number; running: number; succeeded: number; failed: number; bytes: number; totalBytes: number };
  layers: LayerProgress[];
  /** Each (peer, layer) fetch; only in GET /jobs/:id. */
  tasks?: JobTaskView[];
}

/**
 * A lease is renewed this many times in its life, so two renewals in a row can fail (a slow or
 * briefly unreachable database) before it runs out. Jobs whose lease ran out are looked for as often.
 */
const RENEWALS_PER_LEASE = 3;
/** Jobs one replica takes over in one look; the next look takes more. */
const TAKEOVERS_PER_LOOK = 16;

interface Run {
  lease: HeldLease;
  done: Promise<void>;
}

export class JobEngine {
  private readonly runs = new Map<number, Run>();
  private readonly leases: JobLeases;
  private timer?: NodeJS.Timeout;
  private looking?: Promise<void>;
  private stopping = false;

  constructor(
    private readonly db: Kysely<Database>,
    dialect: Dialect,
    private readonly options: JobEngineOptions,
    private readonly log: Logger,
  ) {
    this.leases = new JobLeases(db, dialect, options.replica, options.leaseMs);
    this.runOptions = { ...options, peerDispatcher: options.tls ? new Agent({ connect: clientTlsOptions(options.tls) }) : undefined };
  }

  /** What each job's run needs, with the one connection pool to the peers (TLS when the cluster uses it). */
  private readonly runOptions: PreheatRunOptions;

  /**
   * Takes over the jobs whose lease has run out (those a crashed or stopped replica left, this
   * process's former self included), then keeps this replica's leases renewed and looks again,
   * every leaseMs / 3. Jobs other live replicas hold are left alone.
   */
  async start(): Promise<void> {
    await this.look();
  }

  private look(): Promise<void> {
    this.looking = (async () => {
      await this.renewAll();
      if (!this.stopping) await this.takeOverExpired();
    })()
      .catch((error: Error) => this.log.warn({ err: error.message }, 'job lease round failed; retrying'))
      .finally(() => {
        if (this.stopping) return;
        this.timer = setTimeout(() => void this.look(), this.options.leaseMs / RENEWALS_PER_LEASE);
        this.timer.unref();
      });
    return this.looking;
  }

  private async renewAll(): Promise<void> {
    const ids = [...this.runs.keys()];
    if (!ids.length) return;
    const sentAt = performance.now();
    const held = await this.leases.renew(ids);
    for (const id of ids) {
      const run = this.runs.get(id);
      if (held.has(id)) run?.lease.renewed(sentAt);
      else run?.lease.end(`job ${id} is no longer held by replica ${this.options.replica}`);
    }
  }

  private async takeOverExpired(): Promise<void> {
    const sentAt = performance.now();
    for (const taken of await this.leases.takeOverExpired(TAKEOVERS_PER_LOOK)) {
      const lease = new HeldLease(this.options.leaseMs);
      lease.renewed(sentAt);
      this.log.warn(
        { job: taken.job.id, from: taken.from, leaseExpiredAt: new Date(taken.leaseExpiredAt).toISOString() },
        'took over a job whose lease had run out (its replica died, lost the database or stopped)',
      );
      this.launch(taken.job.id, lease, async () => {
        const rows = await this.db.selectFrom('job_tasks').selectAll().where('job_id', '=', taken.job.id).orderBy('id').execute();
        const run = new PreheatRun(
          jobStart(taken.job),
          rows,
          await this.planAfterTakeover(taken, rows),
          this.leases,
          lease,
          this.runOptions,
          this.log.child({ job: taken.job.id }),
        );
        return run.run(false);
      });
    }
  }

  /**
   * What a replica that did not start the job can know of its origin. Registry credentials are
   * never stored, so a job that had them cannot send a peer to the registry again: its fetches
   * already under way go on, and one that must be asked again fails, saying why.
   */
  private async planAfterTakeover(taken: TakenOver, rows: JobTaskRow[]): Promise<PreheatPlan> {
    const args = JSON.parse(taken.job.args) as { image: string; insecure?: boolean; withCredentials?: boolean };
    const resolved = (taken.job.result ? JSON.parse(taken.job.result) : {}) as PreheatPlan['resolved'];
    const from = taken.from ? `replica ${taken.from}` : 'the manager that started it';
    if (args.withCredentials) {
      return {
        resolved,
        originMissing: `the job's registry credentials were only in the memory of ${from}, which stopped holding the job (credentials are never stored), so no other replica can send a peer to the registry`,
      };
    }
    const sample = rows[0];
    if (!sample) return { resolved };
    try {
      const origin = await resolveOrigin(parseImageReference(args.image), sample.digest, { insecure: args.insecure ?? false });
      return { resolved, origin };
    } catch (error) {
      return {
        resolved,
        originMissing: `replica ${this.options.replica} took the job over from ${from} and could not reach the registry: ${(error as Error).message}`,
      };
    }
  }

  private launch(jobId: number, lease: HeldLease, work: () => Promise<JobState | 'lost'>): void {
    const done = work()
      .then((outcome) => {
        if (outcome === 'lost')
          this.log.info(
            { job: jobId, why: (lease.signal.reason as Error | undefined)?.message },
            'stopped running a job this replica no longer holds',
          );
        else this.options.onFinished?.(outcome);
      })
      .catch((error: Error) =>
        this.log.error({ job: jobId, err: error.message }, 'preheat job crashed; another look will take it over once its lease runs out'),
      )
      .finally(() => {
        lease.end('the run ended');
        this.runs.delete(jobId);
      });
    this.runs.set(jobId, { lease, done });
  }

  /**
   * Checks a preheat request as far as is cheap (the image, the platform, the credentials, that
   * some peer is in scope), records the job, held by this replica, and starts it. Problems found here are 4xx.
   */
  async createPreheat(actor: Actor, input: PreheatRequest): Promise<JobView> {
    let ref;
    try {
      ref = parseImageReference(input.image);
    } catch (error) {
      throw new ManagerError(400, 'invalid_request', `image: ${(error as Error).message}`);
    }
    let platform;
    try {
      platform = parsePlatform(input.platform);
    } catch {
      throw new ManagerError(400, 'invalid_request', `platform: "${input.platform}" must be os/architecture[/variant], e.g. linux/amd64`);
    }
    // The peers are sent the registry's Authorization with each fetch: never in clear.
    if (input.credentials && !this.options.tls) throw new ManagerError(400, 'tls_required', `credentials: ${CREDENTIALS_NEED_TLS}`);
    const targets = await peersInScope(this.db, input.scope, this.options.livenessMs);
    if (targets.length === 0) throw new ManagerError(422, 'no_target_peers', `scope: no active peer is in scope "${input.scope}"`);
    const insecure = input.insecure ?? (this.options.insecureRegistries.includes(ref.registry) || isLoopbackRegistry(ref.registry));
    const image = await resolveImage(ref, platform, { credentials: input.credentials, insecure });
    if (this.stopping) throw new ManagerError(503, 'stopping', 'this manager replica is stopping; try another');

    const now = Date.now();
    // Credentials stay out of the database and the audit log.
    const args = {
      image: image.reference,
      platform: image.platform,
      scope: input.scope,
      insecure,
      withCredentials: Boolean(input.credentials),
    };
    const resolved = { manifestDigest: image.manifestDigest, layers: image.layers.length };
    const sentAt = performance.now();
    const job = await this.db.transaction().execute(async (trx) => {
      const row = await trx
        .insertInto('jobs')
        .values({
          type: 'preheat',
          state: 'pending',
          args: JSON.stringify(args),
          result: JSON.stringify(resolved),
          error: null,
          created_by: actor,
          created_at: now,
          updated_at: now,
          ...this.leases.ownedFromNow(),
        })
        .returningAll()
        .executeTakeFirstOrThrow();
      // The config too: after a preheat, a pull needs nothing from the registry but the manifest.
      const blobs = [...image.layers, image.config];
      const rows = targets.flatMap((peer) =>
        blobs.map((layer) => ({
          job_id: row.id,
          digest: layer.digest,
          size: layer.size,
          host_id: peer.host_id,
          peer_address: formatHostPort({ host: peer.ip, port: peer.upload_port }),
          state: 'pending' as const,
          bytes: 0,
          error: null,
          updated_at: now,
        })),
      );
      for (let i = 0; i < rows.length; i += 500)
        await trx
          .insertInto('job_tasks')
          .values(rows.slice(i, i + 500))
          .execute();
      await recordAudit(trx, actor, 'job.create', `job:${row.id}`, {
        ...args,
        manifestDigest: image.manifestDigest,
        peers: targets.length,
        layers: image.layers.length,
        owner: this.options.replica,
      });
      return row;
    });
    const lease = new HeldLease(this.options.leaseMs);
    lease.renewed(sentAt);
    this.launch(job.id, lease, async () => {
      const rows = await this.db.selectFrom('job_tasks').selectAll().where('job_id', '=', job.id).orderBy('id').execute();
      return new PreheatRun(
        jobStart(job),
        rows,
        { resolved, origin: image },
        this.leases,
        lease,
        this.runOptions,
        this.log.child({ job: job.id }),
      ).run(true);
    });
    return this.get(job.id, false);
  }

  async list(filter: { state?: JobState; limit: number }): Promise<JobView[]> {
    let query = this.db.selectFrom('jobs').selectAll().orderBy('id', 'desc').limit(filter.limit);
    if (filter.state) query = query.where('state', '=', filter.state);
    const jobs = await query.execute();
    if (!jobs.length) return [];
    const tasks = await this.db
      .selectFrom('job_tasks')
      .selectAll()
      .where(
        'job_id',
        'in',
        jobs.map((j) => j.id),
      )
      .execute();
    return jobs.map((job) =>
      toJobView(
        job,
        tasks.filter((t) => t.job_id === job.id),
        false,
      ),
    );
  }

  async get(id: number, withTasks = true): Promise<JobView> {
    const job = await this.db.selectFrom('jobs').selectAll().where('id', '=', id).executeTakeFirst();
    if (!job) throw notFound(`job ${id}`);
    const tasks = await this.db.selectFrom('job_tasks').selectAll().where('job_id', '=', id).orderBy('id').execute();
    return toJobView(job, tasks, withTasks);
  }

  /** Waits for a job this replica runs (tests, shutdown). */
  async settled(id: number): Promise<void> {
    await this.runs.get(id)?.done;
  }

  /**
   * Stops running jobs and gives their leases up, so another replica (or this one, restarted)
   * takes them over at its next look instead of after the lease time. Nothing is marked failed.
   */
  async close(): Promise<void> {
    this.stopping = true;
    clearTimeout(this.timer);
    await this.looking;
    const runs = [...this.runs.entries()];
    for (const [, run] of runs) run.lease.end(`replica ${this.options.replica} is stopping`);
    await Promise.allSettled(runs.map(([, run]) => run.done));
    await this.leases
      .release(runs.map(([id]) => id))
      .catch((error: Error) => this.log.warn({ err: error.message }, 'could not give job leases up; they run out by themselves'));
    await this.runOptions.peerDispatcher?.close();
  }
}

function jobStart(job: JobRow): { id: number; createdAt: number; state: JobState } {
  return { id: job.id, createdAt: job.created_at, state: job.state };
}

function toJobView(job: JobRow, tasks: JobTaskRow[], withTasks: boolean): JobView {
  const count = (state: JobState) => tasks.filter((t) => t.state === state).length;
  const layers = new Map<string, LayerProgress>();
  for (const t of tasks) {
    const layer = layers.get(t.digest) ?? { digest: t.digest, size: t.size, peers: 0, succeeded: 0, failed: 0, bytes: 0 };
    layer.peers++;
    if (t.state === 'succeeded') layer.succeeded++;
    if (t.state === 'failed') layer.failed++;
    layer.bytes += t.bytes;
    layers.set(t.digest, layer);
  }
  return {
    id: job.id,
    type: job.type,
    state: job.state,
    args: JSON.parse(job.args) as Record<string, unknown>,
    result: job.result ? (JSON.parse(job.result) as Record<string, unknown>) : null,
    error: job.error,
    createdBy: job.created_by,
    createdAt: new Date(job.created_at).toISOString(),
    updatedAt: new Date(job.updated_at).toISOString(),
    owner: job.owner,
    takeovers: job.takeovers,
    progress: {
      tasks: tasks.length,
      pending: count('pending'),
      running: count('running'),
      succeeded: count('succeeded'),
      failed: count('failed'),
      bytes: tasks.reduce((sum, t) => sum + t.bytes, 0),
      totalBytes: tasks.reduce((sum, t) => sum + t.size, 0),
    },
    layers: [...layers.values()],
    ...(withTasks
      ? {
          tasks: tasks.map((t) => ({
            digest: t.digest,
            hostId: t.host_id,
            peerAddress: t.peer_address,
            state: t.state,
            size: t.size,
            bytes: t.bytes,
            error: t.error,
            updatedAt: new Date(t.updated_at).toISOString(),
          })),
        }
      : {}),
  };
}
