import { setTimeout as sleep } from 'node:timers/promises';
import type { Kysely } from 'kysely';
import { request } from 'undici';
import { formatHostPort } from '../../common/net.js';
import type { Logger } from '../../common/log.js';
import { parsePlatform } from '../../convert/platform.js';
import { parseImageReference } from '../../oci/reference.js';
import { pieceSizeFor } from '../../storage/piece-plan.js';
import type { Database, JobRow, JobState, JobTaskRow } from '../db/schema.js';
import { ManagerError, notFound } from '../errors.js';
import { recordAudit, type Actor } from './audit.js';
import { isLoopbackRegistry, resolveImage, type ResolvedImage } from './images.js';
import { peersInScope } from './members.js';

/*
 * Preheat jobs: the manager resolves the image, then asks every target peer to fetch every
 * layer (`POST /_starling/preheat` on the peer's upload server) and follows each fetch
 * (`GET /_starling/preheat/<digest>`) until it completes, fails or the job times out. The rows
 * in job_tasks are the progress; the job row holds the outcome and, on failure, why.
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
  clusterToken?: string;
  /** Told of every job that ends, for metrics. */
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
  progress: { tasks: number; pending: number; running: number; succeeded: number; failed: number; bytes: number; totalBytes: number };
  layers: LayerProgress[];
  /** Each (peer, layer) fetch; only in GET /jobs/:id. */
  tasks?: JobTaskView[];
}

interface Plan {
  image: ResolvedImage;
}

/** One (peer, layer) fetch while the job runs. */
interface Fetch {
  row: JobTaskRow;
  done: boolean;
  retriggers: number;
  lastProblem?: string;
}

const MAX_TRIGGER_ATTEMPTS = 3;
const PEER_TIMEOUT_MS = 10_000;

export class JobEngine {
  private readonly running = new Map<number, Promise<void>>();
  private readonly abort = new AbortController();

  constructor(
    private readonly db: Kysely<Database>,
    private readonly options: JobEngineOptions,
    private readonly log: Logger,
  ) {}

  /** Jobs a previous process left running cannot go on (credentials are never stored): they fail, saying so. */
  async recoverInterrupted(): Promise<number> {
    const now = Date.now();
    const reason = 'the manager stopped while the job was running';
    const stale = await this.db.selectFrom('jobs').select('id').where('state', 'in', ['pending', 'running']).execute();
    if (!stale.length) return 0;
    const ids = stale.map((j) => j.id);
    await this.db.transaction().execute(async (trx) => {
      await trx.updateTable('job_tasks').set({ state: 'failed', error: reason, updated_at: now }).where('job_id', 'in', ids).where('state', 'in', ['pending', 'running']).execute();
      await trx.updateTable('jobs').set({ state: 'failed', error: reason, updated_at: now }).where('id', 'in', ids).execute();
      for (const id of ids) await recordAudit(trx, 'system', 'job.fail', `job:${id}`, { reason });
    });
    return ids.length;
  }

  /**
   * Checks a preheat request as far as is cheap (the image, the platform, the credentials, that
   * some peer is in scope), records the job and starts it. Problems found here are 4xx.
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
    const targets = await peersInScope(this.db, input.scope, this.options.livenessMs);
    if (targets.length === 0) throw new ManagerError(422, 'no_target_peers', `scope: no active peer is in scope "${input.scope}"`);
    const insecure = input.insecure ?? (this.options.insecureRegistries.includes(ref.registry) || isLoopbackRegistry(ref.registry));
    const image = await resolveImage(ref, platform, { credentials: input.credentials, insecure });

    const now = Date.now();
    // Credentials stay out of the database and the audit log.
    const args = { image: image.reference, platform: image.platform, scope: input.scope, insecure, withCredentials: Boolean(input.credentials) };
    const jobId = await this.db.transaction().execute(async (trx) => {
      const job = await trx
        .insertInto('jobs')
        .values({ type: 'preheat', state: 'pending', args: JSON.stringify(args), result: null, error: null, created_by: actor, created_at: now, updated_at: now })
        .returning('id')
        .executeTakeFirstOrThrow();
      // The config too: after a preheat, a pull needs nothing from the registry but the manifest.
      const blobs = [...image.layers, image.config];
      const rows = targets.flatMap((peer) =>
        blobs.map((layer) => ({
          job_id: job.id,
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
      for (let i = 0; i < rows.length; i += 500) await trx.insertInto('job_tasks').values(rows.slice(i, i + 500)).execute();
      await recordAudit(trx, actor, 'job.create', `job:${job.id}`, { ...args, manifestDigest: image.manifestDigest, peers: targets.length, layers: image.layers.length });
      return job.id;
    });
    const run = this.run(jobId, { image }).catch((error: Error) => this.log.error({ job: jobId, err: error.message }, 'preheat job crashed'));
    this.running.set(jobId, run);
    void run.finally(() => this.running.delete(jobId));
    return this.get(jobId, false);
  }

  async list(filter: { state?: JobState; limit: number }): Promise<JobView[]> {
    let query = this.db.selectFrom('jobs').selectAll().orderBy('id', 'desc').limit(filter.limit);
    if (filter.state) query = query.where('state', '=', filter.state);
    const jobs = await query.execute();
    if (!jobs.length) return [];
    const tasks = await this.db.selectFrom('job_tasks').selectAll().where('job_id', 'in', jobs.map((j) => j.id)).execute();
    return jobs.map((job) => toJobView(job, tasks.filter((t) => t.job_id === job.id), false));
  }

  async get(id: number, withTasks = true): Promise<JobView> {
    const job = await this.db.selectFrom('jobs').selectAll().where('id', '=', id).executeTakeFirst();
    if (!job) throw notFound(`job ${id}`);
    const tasks = await this.db.selectFrom('job_tasks').selectAll().where('job_id', '=', id).orderBy('id').execute();
    return toJobView(job, tasks, withTasks);
  }

  /** Waits for a running job (tests, shutdown). */
  async settled(id: number): Promise<void> {
    await this.running.get(id);
  }

  /** Stops following jobs; those still running are marked failed. */
  async close(): Promise<void> {
    this.abort.abort();
    await Promise.allSettled([...this.running.values()]);
  }

  private async run(jobId: number, plan: Plan): Promise<void> {
    const started = Date.now();
    const deadline = started + this.options.timeoutMs;
    await this.setJob(jobId, { state: 'running' });
    const rows = await this.db.selectFrom('job_tasks').selectAll().where('job_id', '=', jobId).orderBy('id').execute();
    const fetches: Fetch[] = rows.map((row) => ({ row, done: false, retriggers: 0 }));

    await this.eachLimited(fetches, (f) => this.trigger(f, plan));
    while (fetches.some((f) => !f.done) && Date.now() < deadline && !this.abort.signal.aborted) {
      await sleep(Math.min(this.options.pollMs, Math.max(0, deadline - Date.now())), undefined, { signal: this.abort.signal }).catch(() => {});
      if (this.abort.signal.aborted) break;
      await this.eachLimited(
        fetches.filter((f) => !f.done),
        (f) => this.poll(f, plan),
      );
    }
    for (const f of fetches.filter((f) => !f.done)) {
      const why = this.abort.signal.aborted
        ? 'the manager stopped while the job was running'
        : `timed out after ${Math.round((Date.now() - started) / 1000)} s with ${f.row.bytes} of ${f.row.size} bytes${f.lastProblem ? ` (last problem: ${f.lastProblem})` : ''}`;
      await this.finish(f, 'failed', why);
    }

    const failed = fetches.filter((f) => f.row.state === 'failed');
    const bytes = fetches.reduce((sum, f) => sum + f.row.bytes, 0);
    const result = { manifestDigest: plan.image.manifestDigest, layers: plan.image.layers.length, peers: new Set(fetches.map((f) => f.row.host_id)).size, bytes };
    if (failed.length === 0) {
      await this.setJob(jobId, { state: 'succeeded', result: JSON.stringify(result) }, 'job.succeed', result);
      this.options.onFinished?.('succeeded');
    } else {
      // One line per failing peer (the first three), so one broken peer does not hide another.
      const byPeer = new Map<string, Fetch[]>();
      for (const f of failed) byPeer.set(f.row.host_id, [...(byPeer.get(f.row.host_id) ?? []), f]);
      const first = [...byPeer.values()].slice(0, 3).map((fs) => {
        const f = fs[0]!;
        return `peer ${f.row.host_id} (${f.row.peer_address}), ${fs.length > 1 ? `${fs.length} blobs, first ` : ''}blob ${f.row.digest}: ${f.row.error}`;
      });
      const error = `${failed.length} of ${fetches.length} blob fetches failed: ${first.join('; ')}${byPeer.size > 3 ? '; …' : ''}`;
      await this.setJob(jobId, { state: 'failed', result: JSON.stringify(result), error }, 'job.fail', { reason: error });
      this.options.onFinished?.('failed');
    }
  }

  /** Asks the peer to fetch the layer; connection problems are retried, a refusal is final. */
  private async trigger(f: Fetch, plan: Plan): Promise<void> {
    const body = {
      taskId: f.row.digest,
      contentLength: f.row.size,
      pieceSize: pieceSizeFor(f.row.size),
      origin: { url: plan.image.blobUrl(f.row.digest), headers: plan.image.originHeaders },
    };
    for (let attempt = 1; ; attempt++) {
      try {
        const res = await request(`http://${f.row.peer_address}/_starling/preheat`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...this.authHeader() },
          body: JSON.stringify(body),
          headersTimeout: PEER_TIMEOUT_MS,
          bodyTimeout: PEER_TIMEOUT_MS,
        });
        const text = await res.body.text();
        if (res.statusCode === 202 || res.statusCode === 200) {
          await this.update(f, { state: 'running' });
          return;
        }
        return this.finish(f, 'failed', `the peer refused the preheat: HTTP ${res.statusCode}${peerMessage(text)}`);
      } catch (error) {
        f.lastProblem = `cannot reach the peer: ${(error as Error).message}`;
        if (attempt >= MAX_TRIGGER_ATTEMPTS || this.abort.signal.aborted) return this.finish(f, 'failed', f.lastProblem);
        await sleep(this.options.pollMs, undefined, { signal: this.abort.signal }).catch(() => {});
      }
    }
  }

  private async poll(f: Fetch, plan: Plan): Promise<void> {
    let res;
    try {
      res = await request(`http://${f.row.peer_address}/_starling/preheat/${f.row.digest}`, {
        headers: this.authHeader(),
        headersTimeout: PEER_TIMEOUT_MS,
        bodyTimeout: PEER_TIMEOUT_MS,
      });
    } catch (error) {
      // The peer may be restarting; the job's deadline bounds the wait.
      f.lastProblem = `cannot reach the peer: ${(error as Error).message}`;
      return;
    }
    const text = await res.body.text();
    if (res.statusCode === 404) {
      // The peer has no record of the fetch (it restarted, or evicted the task): ask again.
      if (f.retriggers++ >= MAX_TRIGGER_ATTEMPTS) return this.finish(f, 'failed', `the peer lost the fetch ${f.retriggers} times${peerMessage(text)}`);
      f.lastProblem = `the peer has no record of the fetch${peerMessage(text)}`;
      return this.trigger(f, plan);
    }
    if (res.statusCode !== 200) {
      f.lastProblem = `status answered HTTP ${res.statusCode}${peerMessage(text)}`;
      return;
    }
    let status: { storedBytes?: unknown; complete?: unknown; error?: unknown };
    try {
      status = JSON.parse(text) as typeof status;
    } catch {
      f.lastProblem = 'status answer is not JSON';
      return;
    }
    const bytes = typeof status.storedBytes === 'number' && status.storedBytes >= 0 ? Math.min(status.storedBytes, f.row.size) : f.row.bytes;
    if (status.complete === true) return this.finish(f, 'succeeded', null, f.row.size);
    if (typeof status.error === 'string' && status.error) return this.finish(f, 'failed', `the peer's fetch failed: ${status.error}`, bytes);
    if (bytes !== f.row.bytes) await this.update(f, { bytes });
  }

  private async finish(f: Fetch, state: 'succeeded' | 'failed', error: string | null, bytes = f.row.bytes): Promise<void> {
    f.done = true;
    await this.update(f, { state, error, bytes });
  }

  private async update(f: Fetch, change: Partial<Pick<JobTaskRow, 'state' | 'bytes' | 'error'>>): Promise<void> {
    const updated_at = Date.now();
    await this.db.updateTable('job_tasks').set({ ...change, updated_at }).where('id', '=', f.row.id).execute();
    f.row = { ...f.row, ...change, updated_at };
  }

  private async setJob(id: number, change: Partial<Pick<JobRow, 'state' | 'result' | 'error'>>, action?: string, detail?: Record<string, unknown>): Promise<void> {
    await this.db.transaction().execute(async (trx) => {
      await trx.updateTable('jobs').set({ ...change, updated_at: Date.now() }).where('id', '=', id).execute();
      if (action) await recordAudit(trx, 'system', action, `job:${id}`, detail);
    });
  }

  private authHeader(): Record<string, string> {
    return this.options.clusterToken ? { authorization: `Bearer ${this.options.clusterToken}` } : {};
  }

  /** Runs `work` over `items` with at most `concurrency` in flight. */
  private async eachLimited<T>(items: T[], work: (item: T) => Promise<void>): Promise<void> {
    let next = 0;
    const lanes = Array.from({ length: Math.min(this.options.concurrency, items.length) }, async () => {
      while (next < items.length) await work(items[next++]!);
    });
    await Promise.all(lanes);
  }
}

function peerMessage(text: string): string {
  try {
    const parsed = JSON.parse(text) as { error?: unknown };
    if (typeof parsed.error === 'string') return `: ${parsed.error}`;
  } catch {
    // not JSON
  }
  const plain = text.trim().slice(0, 200);
  return plain ? `: ${plain}` : '';
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
