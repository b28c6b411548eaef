import { setTimeout as sleep } from 'node:timers/promises';
import { request, type Dispatcher } from 'undici';
import { itemAt } from '../../common/indexing.js';
import type { Logger } from '../../common/log.js';
import { httpScheme, type ClientTls } from '../../common/tls.js';
import { fetchStatusSchema, PREHEAT_PATH, preheatStatusPath, type BlobFetchRequest } from '../../rpc/upload-api.js';
import { parseWire } from '../../rpc/wire.js';
import { pieceSizeFor } from '../../storage/piece-plan.js';
import type { JobState, JobTaskRow } from '../db/schema.js';
import type { BlobOrigin } from './images.js';
import { LeaseLostError, type HeldLease, type JobLeases } from './job-leases.js';
import type { ClusterToken } from '../../common/token.js';

/*
 * One preheat job, run by the replica that holds it: ask every target peer to fetch every blob
 * (`POST /_starling/preheat` on the peer's upload server), then follow each fetch
 * (`GET /_starling/preheat/<digest>`) until it completes, fails or the job times out. The rows in
 * job_tasks are the progress; the job row holds the outcome and, on failure, why. Every write is
 * conditional on still holding the job, and every peer request ends when the hold does.
 */

export interface PreheatPlan {
  /** What the job resolved as it started: its result, to which the end adds peers and bytes. */
  resolved: { manifestDigest?: string; layers?: number };
  /** Where peers read the blobs; undefined when this replica cannot send a peer there... */
  origin?: BlobOrigin;
  /** ...and why (what a fetch that must be asked again fails with). */
  originMissing?: string;
}

export interface PreheatRunOptions {
  pollMs: number;
  /** From the job's creation, whoever runs it. */
  timeoutMs: number;
  concurrency: number;
  clusterToken?: ClusterToken;
  /** With TLS, the peers' upload ports are reached through this (checked against the cluster CA). */
  tls?: ClientTls;
  peerDispatcher?: Dispatcher;
}

/** One (peer, blob) fetch while the job runs. */
interface Fetch {
  row: JobTaskRow;
  done: boolean;
  retriggers: number;
  lastProblem?: string;
}

/** Why a preheat with registry credentials is refused by a manager that reaches the peers over plain HTTP. */
export const CREDENTIALS_NEED_TLS =
  'registry credentials go to the peers with the preheat, and this manager reaches them over plain HTTP: run the manager with TLS (--tls-cert, --tls-key, --tls-ca) to preheat with credentials';

const MAX_TRIGGER_ATTEMPTS = 3;
const PEER_TIMEOUT_MS = 10_000;

export class PreheatRun {
  private readonly fetches: Fetch[];

  constructor(
    private readonly job: { id: number; createdAt: number; state: JobState },
    rows: JobTaskRow[],
    private readonly plan: PreheatPlan,
    private readonly leases: JobLeases,
    private readonly lease: HeldLease,
    private readonly options: PreheatRunOptions,
    private readonly log: Logger,
  ) {
    this.fetches = rows.map((row) => ({ row, done: row.state === 'succeeded' || row.state === 'failed', retriggers: 0 }));
  }

  /**
   * Runs the job to its end and returns its final state, or 'lost' when the hold ended first
   * (nothing more is written then). A new job asks every peer at once; a job taken over asks
   * each peer how its fetch is going first, so a fetch the previous owner started is not asked for twice.
   */
  async run(fresh: boolean): Promise<JobState | 'lost'> {
    try {
      if (this.job.state === 'pending') await this.leases.updateJob(this.job.id, { state: 'running' });
      const deadline = this.job.createdAt + this.options.timeoutMs;
      if (fresh) await this.eachLimited(this.open(), (f) => this.trigger(f));
      while (this.open().length && Date.now() < deadline) {
        await sleep(Math.min(this.options.pollMs, Math.max(0, deadline - Date.now())), undefined, { signal: this.lease.signal }).catch(
          () => {},
        );
        this.assertHeld();
        await this.eachLimited(this.open(), (f) => this.poll(f));
      }
      this.assertHeld();
      for (const f of this.open()) {
        const why = `timed out after ${Math.round((Date.now() - this.job.createdAt) / 1000)} s with ${f.row.bytes} of ${f.row.size} bytes${f.lastProblem ? ` (last problem: ${f.lastProblem})` : ''}`;
        await this.finish(f, 'failed', why);
      }
      return await this.conclude();
    } catch (error) {
      if (error instanceof LeaseLostError || this.lease.signal.aborted) return 'lost';
      throw error;
    }
  }

  private open(): Fetch[] {
    return this.fetches.filter((f) => !f.done);
  }

  private assertHeld(): void {
    if (!this.lease.held)
      throw this.lease.signal.reason instanceof LeaseLostError ? this.lease.signal.reason : new LeaseLostError('the lease ran out');
  }

  private async conclude(): Promise<JobState> {
    const failed = this.fetches.filter((f) => f.row.state === 'failed');
    const bytes = this.fetches.reduce((sum, f) => sum + f.row.bytes, 0);
    const result = { ...this.plan.resolved, peers: new Set(this.fetches.map((f) => f.row.host_id)).size, bytes };
    if (failed.length === 0) {
      await this.leases.updateJob(
        this.job.id,
        { state: 'succeeded', result: JSON.stringify(result), error: null },
        { action: 'job.succeed', detail: result },
      );
      return 'succeeded';
    }
    // One line per failing peer (the first three), so one broken peer does not hide another.
    const byPeer = new Map<string, Fetch[]>();
    for (const f of failed) byPeer.set(f.row.host_id, [...(byPeer.get(f.row.host_id) ?? []), f]);
    const first = [...byPeer.values()].slice(0, 3).map((fs) => {
      const f = itemAt(fs, 0); // a peer is in byPeer once it has a failed fetch
      return `peer ${f.row.host_id} (${f.row.peer_address}), ${fs.length > 1 ? `${fs.length} blobs, first ` : ''}blob ${f.row.digest}: ${f.row.error}`;
    });
    const error = `${failed.length} of ${this.fetches.length} blob fetches failed: ${first.join('; ')}${byPeer.size > 3 ? '; …' : ''}`;
    await this.leases.updateJob(
      this.job.id,
      { state: 'failed', result: JSON.stringify(result), error },
      { action: 'job.fail', detail: { reason: error } },
    );
    return 'failed';
  }

  /** Asks the peer to fetch the blob; connection problems are retried, a refusal is final. */
  private async trigger(f: Fetch): Promise<void> {
    const { origin } = this.plan;
    if (!origin) return this.finish(f, 'failed', this.plan.originMissing ?? 'no origin to fetch from');
    const body: BlobFetchRequest = {
      taskId: f.row.digest,
      contentLength: f.row.size,
      pieceSize: pieceSizeFor(f.row.size),
      origin: { url: origin.blobUrl(f.row.digest), headers: origin.originHeaders },
    };
    const url = this.peerUrl(f.row.peer_address, PREHEAT_PATH);
    if (Object.keys(body.origin.headers).length > 0 && new URL(url).protocol !== 'https:')
      return this.finish(f, 'failed', CREDENTIALS_NEED_TLS);
    for (let attempt = 1; ; attempt++) {
      this.assertHeld();
      try {
        const res = await request(url, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...this.headers() },
          body: JSON.stringify(body),
          headersTimeout: PEER_TIMEOUT_MS,
          bodyTimeout: PEER_TIMEOUT_MS,
          signal: this.lease.signal,
          ...(this.options.peerDispatcher ? { dispatcher: this.options.peerDispatcher } : {}),
        });
        const text = await res.body.text();
        if (res.statusCode === 202 || res.statusCode === 200) return this.update(f, { state: 'running' });
        return this.finish(f, 'failed', `the peer refused the preheat: HTTP ${res.statusCode}${peerMessage(text)}`);
      } catch (error) {
        this.assertHeld();
        f.lastProblem = `cannot reach the peer: ${(error as Error).message}`;
        if (attempt >= MAX_TRIGGER_ATTEMPTS) return this.finish(f, 'failed', f.lastProblem);
        await sleep(this.options.pollMs, undefined, { signal: this.lease.signal }).catch(() => {});
      }
    }
  }

  private async poll(f: Fetch): Promise<void> {
    this.assertHeld();
    let res;
    try {
      res = await request(this.peerUrl(f.row.peer_address, preheatStatusPath(f.row.digest)), {
        headers: this.headers(),
        headersTimeout: PEER_TIMEOUT_MS,
        bodyTimeout: PEER_TIMEOUT_MS,
        signal: this.lease.signal,
        ...(this.options.peerDispatcher ? { dispatcher: this.options.peerDispatcher } : {}),
      });
    } catch (error) {
      this.assertHeld();
      // The peer may be restarting; the job's deadline bounds the wait.
      f.lastProblem = `cannot reach the peer: ${(error as Error).message}`;
      return;
    }
    const text = await res.body.text();
    if (res.statusCode === 404) {
      // Never asked (a job taken over before its owner recorded the ask): ask now.
      if (f.row.state === 'pending') return this.trigger(f);
      // The peer has no record of the fetch (it restarted, or evicted the task): ask again.
      if (f.retriggers++ >= MAX_TRIGGER_ATTEMPTS)
        return this.finish(f, 'failed', `the peer lost the fetch ${f.retriggers} times${peerMessage(text)}`);
      f.lastProblem = `the peer has no record of the fetch${peerMessage(text)}`;
      return this.trigger(f);
    }
    if (res.statusCode !== 200) {
      f.lastProblem = `status answered HTTP ${res.statusCode}${peerMessage(text)}`;
      return;
    }
    let status;
    try {
      status = parseWire(fetchStatusSchema, JSON.parse(text), 'preheat status from the peer');
    } catch (error) {
      f.lastProblem = error instanceof SyntaxError ? 'status answer is not JSON' : (error as Error).message;
      return;
    }
    const bytes = Math.min(status.storedBytes, f.row.size);
    if (status.complete) return this.finish(f, 'succeeded', null, f.row.size);
    if (status.error) return this.finish(f, 'failed', `the peer's fetch failed: ${status.error}`, bytes);
    if (f.row.state === 'pending') return this.update(f, { state: 'running', bytes });
    if (bytes !== f.row.bytes) await this.update(f, { bytes });
  }

  private async finish(f: Fetch, state: 'succeeded' | 'failed', error: string | null, bytes = f.row.bytes): Promise<void> {
    await this.update(f, { state, error, bytes });
    f.done = true;
  }

  private async update(f: Fetch, change: Partial<Pick<JobTaskRow, 'state' | 'bytes' | 'error'>>): Promise<void> {
    const updatedAt = Date.now();
    await this.leases.updateFetch(this.job.id, f.row.id, change, updatedAt);
    f.row = { ...f.row, ...change, updated_at: updatedAt };
  }

  private peerUrl(address: string, path: string): string {
    return `${httpScheme(this.options.tls)}://${address}${path}`;
  }

  /** The cluster token, and which replica asks (for the peers' logs). */
  private headers(): Record<string, string> {
    return {
      'user-agent': `starling-manager (replica ${this.leases.replica})`,
      ...(this.options.clusterToken ? { authorization: this.options.clusterToken.authorization } : {}),
    };
  }

  /** Runs `work` over `items` with at most `concurrency` in flight. */
  private async eachLimited<T>(items: T[], work: (item: T) => Promise<void>): Promise<void> {
    let next = 0;
    const lanes = Array.from({ length: Math.min(this.options.concurrency, items.length) }, async () => {
      while (next < items.length) await work(itemAt(items, next++));
    });
    // Every lane ends before the first failure is raised: none writes after the run returned.
    const outcomes = await Promise.allSettled(lanes);
    const failure = outcomes.find((o): o is PromiseRejectedResult => o.status === 'rejected');
    if (failure) throw failure.reason;
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
