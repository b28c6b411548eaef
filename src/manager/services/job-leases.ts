import { sql, type Kysely, type RawBuilder } from 'kysely';
import { databaseNowMs } from '../db/clock.js';
import type { Dialect } from '../db/connect.js';
import type { Database, JobRow, JobState, JobTaskRow } from '../db/schema.js';
import { recordAudit } from './audit.js';

/*
 * One manager replica at a time runs a job: the one whose name is in the job's `owner` and whose
 * lease (`lease_expires_at`, in the database's clock) it keeps renewing. A replica that dies stops
 * renewing; once the lease has run out, any replica may take the job over, and the compare-and-set
 * on (owner, lease) lets exactly one of them win. Every write a run makes is conditional on its
 * replica still holding the job, so a replica that was cut off (paused, partitioned) and comes
 * back changes nothing, and a job's final state and error are written once, together.
 */

const UNFINISHED: JobState[] = ['pending', 'running'];

/** The job is no longer this replica's: its lease ran out here, another replica took it, or this one is stopping. */
export class LeaseLostError extends Error {
  override name = 'LeaseLostError';
}

export interface TakenOver {
  job: JobRow;
  /** The replica that held it before (null for a job from a manager without leases). */
  from: string | null;
  /** When that replica's lease ran out (the database's clock, epoch ms). */
  leaseExpiredAt: number;
}

/** The lease rows in the database, as one replica reads and writes them. */
export class JobLeases {
  private readonly now: RawBuilder<number>;

  constructor(
    private readonly db: Kysely<Database>,
    dialect: Dialect,
    /** This replica's name: unique per process, so a restarted replica holds nothing of its former self. */
    readonly replica: string,
    readonly leaseMs: number,
  ) {
    this.now = databaseNowMs(dialect);
  }

  private expiry(): RawBuilder<number> {
    return sql<number>`${this.now} + ${this.leaseMs}`;
  }

  /** The columns of a job this replica creates: held by it from the start. */
  ownedFromNow(): { owner: string; lease_expires_at: RawBuilder<number> } {
    return { owner: this.replica, lease_expires_at: this.expiry() };
  }

  /** Extends the leases of these jobs; returns those this replica still holds (the rest it has lost). */
  async renew(ids: number[]): Promise<Set<number>> {
    if (ids.length === 0) return new Set();
    const rows = await this.db
      .updateTable('jobs')
      .set({ lease_expires_at: this.expiry() })
      .where('id', 'in', ids)
      .where('owner', '=', this.replica)
      .where('state', 'in', UNFINISHED)
      .returning('id')
      .execute();
    return new Set(rows.map((r) => r.id));
  }

  /**
   * Takes over unfinished jobs whose lease has run out, oldest first, at most `limit`. Each is a
   * compare-and-set on the owner and lease read a moment before: of several replicas trying at
   * once, one wins and the others leave the job alone. Each takeover is in the audit log.
   */
  async takeOverExpired(limit: number): Promise<TakenOver[]> {
    const candidates = await this.db
      .selectFrom('jobs')
      .selectAll()
      .where('state', 'in', UNFINISHED)
      .where('lease_expires_at', '<', this.now)
      .orderBy('id')
      .limit(limit)
      .execute();
    const taken: TakenOver[] = [];
    for (const candidate of candidates) {
      const job = await this.db.transaction().execute(async (trx) => {
        const won = await trx
          .updateTable('jobs')
          .set({ owner: this.replica, lease_expires_at: this.expiry(), takeovers: sql<number>`takeovers + 1`, updated_at: Date.now() })
          .where('id', '=', candidate.id)
          .where('state', 'in', UNFINISHED)
          .where('lease_expires_at', '=', candidate.lease_expires_at)
          .where((eb) => (candidate.owner === null ? eb('owner', 'is', null) : eb('owner', '=', candidate.owner)))
          .returningAll()
          .executeTakeFirst();
        if (won) {
          await recordAudit(trx, 'system', 'job.takeover', `job:${candidate.id}`, {
            from: candidate.owner,
            to: this.replica,
            leaseExpiredAt: new Date(candidate.lease_expires_at).toISOString(),
          });
        }
        return won;
      });
      if (job) taken.push({ job, from: candidate.owner, leaseExpiredAt: candidate.lease_expires_at });
    }
    return taken;
  }

  /** Gives these jobs up at once (a stopping replica): the next replica to look takes them over. */
  async release(ids: number[]): Promise<void> {
    if (ids.length === 0) return;
    await this.db
      .updateTable('jobs')
      .set({ lease_expires_at: 0 })
      .where('id', 'in', ids)
      .where('owner', '=', this.replica)
      .where('state', 'in', UNFINISHED)
      .execute();
  }

  /** Changes one fetch of a job this replica holds; throws LeaseLostError when it does not. */
  async updateFetch(
    jobId: number,
    fetchId: number,
    change: Partial<Pick<JobTaskRow, 'state' | 'bytes' | 'error'>>,
    updatedAt: number,
  ): Promise<void> {
    const result = await this.db
      .updateTable('job_tasks')
      .set({ ...change, updated_at: updatedAt })
      .where('id', '=', fetchId)
      .where(
        'job_id',
        'in',
        this.db.selectFrom('jobs').select('id').where('id', '=', jobId).where('owner', '=', this.replica).where('state', 'in', UNFINISHED),
      )
      .executeTakeFirst();
    if (result.numUpdatedRows === 0n) throw this.lost(jobId);
  }

  /**
   * Changes a job this replica holds, with its audit record in the same transaction; throws
   * LeaseLostError (and changes nothing) when it does not hold it. A final state ends the hold.
   */
  async updateJob(
    jobId: number,
    change: Partial<Pick<JobRow, 'state' | 'result' | 'error'>>,
    audit?: { action: string; detail: Record<string, unknown> },
  ): Promise<void> {
    await this.db.transaction().execute(async (trx) => {
      const result = await trx
        .updateTable('jobs')
        .set({ ...change, updated_at: Date.now() })
        .where('id', '=', jobId)
        .where('owner', '=', this.replica)
        .where('state', 'in', UNFINISHED)
        .executeTakeFirst();
      if (result.numUpdatedRows === 0n) throw this.lost(jobId);
      if (audit) await recordAudit(trx, 'system', audit.action, `job:${jobId}`, audit.detail);
    });
  }

  private lost(jobId: number): LeaseLostError {
    return new LeaseLostError(`replica ${this.replica} no longer holds job ${jobId}`);
  }
}

/**
 * What this replica knows of its hold on one job without asking the database. The database's
 * lease runs `leaseMs` from the moment the database applied a renewal, which is after the renewal
 * was sent; counting `leaseMs` from the send, on this process's monotonic clock, ends the hold
 * here no later than any other replica can see it run out there. Requests made for the job carry
 * `signal`, so none outlives the hold, and the peers are never asked by two replicas at once.
 */
export class HeldLease {
  private readonly controller = new AbortController();
  private validUntil = -Infinity;
  private timer?: NodeJS.Timeout;

  constructor(
    private readonly leaseMs: number,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** Aborted (with a LeaseLostError) when the hold ends. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  get held(): boolean {
    return !this.controller.signal.aborted && this.now() < this.validUntil;
  }

  /** The database accepted a claim or renewal that was sent at `sentAt` (this.now's clock). */
  renewed(sentAt: number): void {
    if (this.controller.signal.aborted) return;
    this.validUntil = Math.max(this.validUntil, sentAt + this.leaseMs);
    this.arm();
  }

  /** Ends the hold (idempotent); requests under `signal` are aborted. */
  end(reason: string): void {
    clearTimeout(this.timer);
    if (!this.controller.signal.aborted) this.controller.abort(new LeaseLostError(reason));
  }

  private arm(): void {
    clearTimeout(this.timer);
    const remaining = this.validUntil - this.now();
    if (remaining <= 0) return this.end('its lease ran out before a renewal reached the database');
    this.timer = setTimeout(() => this.arm(), remaining);
    this.timer.unref();
  }
}
