// The job lease (src/manager/services/job-leases.ts) on both databases: who may take a job over,
// that exactly one of several replicas does, and that a replica which lost a job can change
// nothing of it. Then two whole managers on one real PostgreSQL, in this process: one starting
// next to another leaves its job alone, and one cut off from the database stops asking the peers
// before the other takes its job over.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { after, before, describe, test, type TestContext } from 'node:test';
import { sql } from 'kysely';
import pg from 'pg';
import { jobSchema } from '../../src/manager/api/schemas.js';
import { openStore, type Store } from '../../src/manager/db/connect.js';
import { HeldLease, JobLeases, LeaseLostError } from '../../src/manager/services/job-leases.js';
import { buildImage, pushImage } from '../fixtures/images.js';
import { waitFor } from '../fixtures/processes.js';
import { startRegistry, type Registry } from '../fixtures/registry.js';
import { ADMIN_TOKEN, backends, call, CLUSTER_TOKEN, peerBody, startTestManager, type TestManager } from './helpers.js';
import { startStubPeer, type StubPeer } from './stub-peer.js';
import { itemAt } from '../../src/common/indexing.js';

const MINUTE = 60_000;

/** A preheat job row with one fetch, as if `owner` had created it with a lease ending at `leaseExpiresAt`. */
async function insertJob(
  store: Store,
  owner: string | null,
  leaseExpiresAt: number,
  state: 'pending' | 'running' | 'succeeded' = 'running',
) {
  const now = Date.now();
  const job = await store.db
    .insertInto('jobs')
    .values({
      type: 'preheat',
      state,
      args: '{}',
      result: null,
      error: null,
      created_by: 'user:admin',
      created_at: now,
      updated_at: now,
      owner,
      lease_expires_at: leaseExpiresAt,
    })
    .returningAll()
    .executeTakeFirstOrThrow();
  const fetch = await store.db
    .insertInto('job_tasks')
    .values({
      job_id: job.id,
      digest: `sha256:${'a'.repeat(64)}`,
      size: 10,
      host_id: 'h',
      peer_address: '127.0.0.1:1',
      state: 'running',
      bytes: 0,
      error: null,
      updated_at: now,
    })
    .returning('id')
    .executeTakeFirstOrThrow();
  return { id: job.id, fetchId: fetch.id };
}

const jobRow = (store: Store, id: number) => store.db.selectFrom('jobs').selectAll().where('id', '=', id).executeTakeFirstOrThrow();

describe('the local view of a lease', () => {
  test('held until leaseMs after the renewal was sent, by the local clock; ended at once by end()', () => {
    let now = 0;
    const lease = new HeldLease(1_000, () => now);
    assert.equal(lease.held, false, 'nothing is held before the database said so');
    lease.renewed(0);
    now = 999;
    assert.equal(lease.held, true);
    lease.renewed(500); // a renewal sent at 500 extends the hold to 1500
    lease.renewed(200); // one answered out of order does not shorten it
    now = 1_499;
    assert.equal(lease.held, true);
    now = 1_500;
    assert.equal(lease.held, false);
    now = 1_000;
    lease.end('stopping');
    assert.equal(lease.held, false);
    assert.ok(lease.signal.reason instanceof LeaseLostError);
    assert.equal(lease.signal.reason.message, 'stopping');
    lease.renewed(now);
    assert.equal(lease.held, false, 'an ended hold stays ended');
  });

  test('a hold that is not renewed ends by itself, aborting what runs under it', async () => {
    const lease = new HeldLease(50);
    lease.renewed(performance.now());
    // The lease's own timer does not keep a process alive (a manager's server does).
    const alive = setInterval(() => {}, 1_000);
    const [event] = (await once(lease.signal, 'abort').finally(() => clearInterval(alive))) as [Event];
    assert.equal(event.type, 'abort');
    assert.match((lease.signal.reason as Error).message, /lease ran out/);
  });
});

// One PostgreSQL server for the whole file; each describe takes fresh databases from it.
const databases = backends();
after(async () => {
  for (const backend of databases) await backend.stop();
});

for (const backend of databases) {
  describe(`job leases on ${backend.name}`, () => {
    let store: Store;
    let replicas: Store[] = [];
    const leases = (name: string, leaseMs = MINUTE, on = store) => new JobLeases(on.db, on.dialect, name, leaseMs);

    before(async () => {
      const url = await backend.newDatabase();
      store = await openStore(url);
      // PostgreSQL: each replica its own connection pool, as separate processes have. SQLite: one
      // connection for all (a second one in this process would wait on the first's lock with the
      // event loop blocked; separate processes share a file fine, see replicas.test.ts).
      replicas = backend.name === 'postgres' ? await Promise.all([1, 2, 3].map(() => openStore(url))) : [store, store, store];
    });
    after(async () => {
      for (const s of new Set([store, ...replicas])) await s?.close();
    });

    test('a job created by a replica is held by it: renewals keep it, no other replica takes it or renews it', async () => {
      const a = leases('replica-a');
      const created = await store.db
        .insertInto('jobs')
        .values({
          type: 'preheat',
          state: 'pending',
          args: '{}',
          result: null,
          error: null,
          created_by: 'user:admin',
          created_at: Date.now(),
          updated_at: Date.now(),
          ...a.ownedFromNow(),
        })
        .returningAll()
        .executeTakeFirstOrThrow();
      assert.equal(created.owner, 'replica-a');
      // The database's clock and this machine's are one here: the lease ends a minute from now.
      assert.ok(Math.abs(created.lease_expires_at - (Date.now() + MINUTE)) < 5_000, `lease ends at ${created.lease_expires_at}`);
      const b = leases('replica-b');
      assert.deepEqual(await b.takeOverExpired(10), []);
      assert.deepEqual(await b.renew([created.id]), new Set());
      assert.deepEqual(await a.renew([created.id]), new Set([created.id]));
      assert.equal((await jobRow(store, created.id)).owner, 'replica-a');
      await a.updateJob(created.id, { state: 'failed', error: 'test over' });
    });

    test('once the lease has run out, exactly one of three replicas racing takes the job over, audited', async () => {
      const { id } = await insertJob(store, 'replica-dead', 1);
      const racers = replicas.map((r, i) => leases(`racer-${i}`, MINUTE, r));
      const results = await Promise.all(racers.map((r) => r.takeOverExpired(10)));
      const winners = results.flatMap((taken, i) =>
        taken.filter((t) => t.job.id === id).map((t) => ({ racer: itemAt(racers, i).replica, t })),
      );
      assert.equal(winners.length, 1, JSON.stringify(results));
      const { racer, t } = itemAt(winners, 0);
      assert.deepEqual([t.from, t.leaseExpiredAt, t.job.owner, t.job.takeovers], ['replica-dead', 1, racer, 1]);
      const row = await jobRow(store, id);
      assert.equal(row.owner, racer);
      assert.ok(row.lease_expires_at > Date.now() + MINUTE - 5_000);
      const audit = await store.db.selectFrom('audit_log').selectAll().where('target', '=', `job:${id}`).execute();
      assert.deepEqual(
        audit.map((a) => [a.actor, a.action, JSON.parse(a.detail)]),
        [['system', 'job.takeover', { from: 'replica-dead', to: racer, leaseExpiredAt: new Date(1).toISOString() }]],
      );
      await leases(racer).updateJob(id, { state: 'failed', error: 'test over' });
    });

    test('a replica that lost its job changes nothing: fetch and final writes refused, renewal reports the loss, release leaves the new lease', async () => {
      const { id, fetchId } = await insertJob(store, 'replica-a', 1);
      const a = leases('replica-a');
      const b = leases('replica-b');
      assert.equal((await b.takeOverExpired(10)).length, 1);
      const fetchBefore = await store.db.selectFrom('job_tasks').selectAll().where('id', '=', fetchId).executeTakeFirstOrThrow();
      const jobBefore = await jobRow(store, id);

      await assert.rejects(a.updateFetch(id, fetchId, { state: 'failed', error: 'stale news' }, Date.now()), LeaseLostError);
      await assert.rejects(
        a.updateJob(id, { state: 'failed', error: 'the manager stopped while the job was running' }, { action: 'job.fail', detail: {} }),
        LeaseLostError,
      );
      assert.deepEqual(await a.renew([id]), new Set());
      await a.release([id]);
      assert.deepEqual(await jobRow(store, id), jobBefore);
      assert.deepEqual(await store.db.selectFrom('job_tasks').selectAll().where('id', '=', fetchId).executeTakeFirstOrThrow(), fetchBefore);
      assert.equal(
        (await store.db.selectFrom('audit_log').select('action').where('target', '=', `job:${id}`).execute()).filter(
          (r) => r.action === 'job.fail',
        ).length,
        0,
      );

      // The owner's writes land; its final state ends the hold, so nothing after it does.
      await b.updateFetch(id, fetchId, { state: 'succeeded', bytes: 10 }, Date.now());
      await b.updateJob(id, { state: 'succeeded', error: null, result: '{}' }, { action: 'job.succeed', detail: {} });
      await assert.rejects(b.updateJob(id, { state: 'failed', error: 'late' }), LeaseLostError);
      const final = await jobRow(store, id);
      assert.deepEqual([final.state, final.error], ['succeeded', null]);
      assert.deepEqual(await b.takeOverExpired(10), [], 'a finished job is never taken over');
    });

    test('a released job is taken over at once, by the next replica that looks', async () => {
      const a = leases('replica-a');
      const { id } = await insertJob(store, 'replica-a', Date.now() + MINUTE);
      const b = leases('replica-b');
      assert.deepEqual(await b.takeOverExpired(10), []);
      await a.release([id]);
      const taken = await b.takeOverExpired(10);
      assert.deepEqual(
        taken.map((t) => [t.job.id, t.from]),
        [[id, 'replica-a']],
      );
      await b.updateJob(id, { state: 'failed', error: 'test over' });
    });
  });
}

describe('two managers on one PostgreSQL database, in one process', () => {
  const postgres = databases.find((b) => b.name === 'postgres');
  assert.ok(postgres, 'PostgreSQL is among the databases');
  let registry: Registry;
  let image: string;
  let url: string;

  before(async () => {
    let built;
    [registry, built, url] = await Promise.all([
      startRegistry(),
      buildImage({ layers: [{ sizeBytes: 100_000, seed: 'manager-leases-1' }] }),
      postgres.newDatabase(),
    ]);
    await pushImage(built.layoutDir, built.tag, registry.host, 'lease/app:1');
    image = `${registry.host}/lease/app:1`;
  });
  after(async () => {
    await registry?.stop();
  });

  /** A manager with a 1 s job lease, stopped when the test ends (none of a test may take another's jobs). */
  const start = async (t: TestContext, db: string) => {
    const m = await startTestManager(db, {
      keepalive: { intervalMs: 200, missedLimit: 5 },
      preheat: { pollMs: 50, timeoutMs: 30_000, concurrency: 4, leaseMs: 1_000 },
    });
    t.after(() => m.stop());
    return m;
  };

  /** A stalled stub peer kept registered through `via` until the test ends. */
  async function stalledPeer(t: TestContext, via: () => TestManager, id: string, zone: string): Promise<StubPeer> {
    const stub = await startStubPeer(id, 'stall', CLUSTER_TOKEN, { delayMs: 60 });
    const keepalive = () =>
      call(via().url, 'POST', '/api/v1/peers/keepalive', {
        token: CLUSTER_TOKEN,
        body: peerBody(id, { uploadPort: stub.port, labels: { zone } }),
      });
    assert.equal((await keepalive()).status, 200);
    const timer = setInterval(() => void keepalive().catch(() => {}), 100);
    t.after(async () => {
      clearInterval(timer);
      await stub.close();
    });
    return stub;
  }

  const job = async (m: TestManager, id: number) =>
    jobSchema.parse((await call(m.url, 'GET', `/api/v1/jobs/${id}`, { token: ADMIN_TOKEN })).body);

  test('a connection the server drops in the middle of a transaction fails that transaction, not the process', async (t) => {
    const store = await openStore(url);
    t.after(() => store.close());
    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    t.after(() => admin.end());
    const uncaught: unknown[] = [];
    const onUncaught = (error: unknown) => uncaught.push(error);
    process.on('uncaughtException', onUncaught);
    t.after(() => process.off('uncaughtException', onUncaught));
    const outcome = store.db.transaction().execute(async (trx) => {
      const { rows } = await sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`.execute(trx);
      // Between two statements the client is checked out and idle: the termination arrives as an
      // event on it, not as the answer to a query.
      await admin.query('SELECT pg_terminate_backend($1)', [rows[0]?.pid]);
      await waitFor(
        () => admin.query('SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = $1', [rows[0]?.pid]).then((r) => r.rows[0].n === 0),
        5_000,
        'the backend gone',
      );
      await new Promise((resolve) => setTimeout(resolve, 100));
      await sql`SELECT 1`.execute(trx);
    });
    await assert.rejects(outcome);
    assert.deepEqual(uncaught, [], 'no error escaped as an uncaught exception');
    assert.equal(
      (await sql<{ one: number }>`SELECT 1 AS one`.execute(store.db)).rows[0]?.one,
      1,
      'the pool serves again with a new connection',
    );
  });

  test("a manager starting next to another leaves that one's running job alone", async (t) => {
    const a = await start(t, url);
    const peer = await stalledPeer(t, () => a, 'next-to', 'next-to');
    const created = await call(a.url, 'POST', '/api/v1/jobs', {
      token: ADMIN_TOKEN,
      body: { type: 'preheat', image, platform: 'linux/amd64', scope: 'zone:next-to' },
    });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    await waitFor(async () => (await job(a, created.body.id)).progress.bytes > 0, 5_000, 'the job under way');

    const b = await start(t, url);
    const seenByB = await job(b, created.body.id);
    assert.deepEqual([seenByB.state, seenByB.error, seenByB.owner, seenByB.takeovers], ['running', null, a.manager.replica, 0]);
    peer.unstall();
    await a.manager.jobs.settled(created.body.id);
    const done = await job(b, created.body.id);
    assert.deepEqual([done.state, done.error, done.owner, done.takeovers], ['succeeded', null, a.manager.replica, 0]);
    assert.ok(
      peer.requests.every((r) => r.replica === a.manager.replica),
      'only its owner asked the peer',
    );
  });

  test('a manager cut off from the database stops asking the peers before the other takes its job over; back, it changes nothing', async (t) => {
    // Replica A logs in as its own role, so that the test can shut A alone out of the database.
    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    t.after(() => admin.end());
    await admin.query('CREATE ROLE replica_a LOGIN SUPERUSER');
    const asA = new URL(url);
    asA.username = 'replica_a';
    const b = await start(t, url);
    const a = await start(t, asA.href);
    const peer = await stalledPeer(t, () => b, 'cut-off', 'cut-off');
    const created = await call(a.url, 'POST', '/api/v1/jobs', {
      token: ADMIN_TOKEN,
      body: { type: 'preheat', image, platform: 'linux/amd64', scope: 'zone:cut-off' },
    });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    assert.equal(created.body.owner, a.manager.replica);
    // Progress recorded: from here A's polls find nothing new to write, so only its lease stops them.
    await waitFor(async () => (await job(b, created.body.id)).progress.bytes > 0, 5_000, 'A following the fetches');

    await admin.query('ALTER ROLE replica_a NOLOGIN');
    await admin.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'replica_a'");
    const cutAt = performance.now();
    await waitFor(async () => (await job(b, created.body.id)).owner === b.manager.replica, 10_000, 'B taking the job over', 100);
    const tookMs = performance.now() - cutAt;
    await waitFor(() => peer.requests.some((r) => r.replica === b.manager.replica), 5_000, 'B asking the peer');
    const fromA = peer.requests.filter((r) => r.replica === a.manager.replica);
    const fromB = peer.requests.filter((r) => r.replica === b.manager.replica);
    assert.equal(fromA.length + fromB.length, peer.requests.length);
    assert.ok(
      fromA.every((r) => r.endedAt !== undefined),
      'every request of A had ended',
    );
    const lastOfA = Math.max(...fromA.map((r) => r.endedAt ?? Infinity));
    const firstOfB = Math.min(...fromB.map((r) => r.startedAt));
    assert.ok(lastOfA <= firstOfB, `A's last request ended ${(lastOfA - firstOfB).toFixed(0)} ms after B's first began`);
    assert.ok(tookMs < 1_000 + 1_000 / 3 + 1_500, `taken over ${tookMs.toFixed(0)} ms after the cut (lease 1 s)`);
    assert.equal(fromB.filter((r) => r.kind === 'trigger').length, 0, 'B asked how the fetch went; it did not ask for it again');

    // A gets its database back: the job is B's, and A neither writes nor asks the peer again.
    await admin.query('ALTER ROLE replica_a LOGIN');
    const askedByA = fromA.length;
    await waitFor(async () => (await call(a.url, 'GET', '/readyz')).status === 200, 10_000, 'A ready again');
    peer.unstall();
    await b.manager.jobs.settled(created.body.id);
    const done = await job(a, created.body.id);
    assert.deepEqual([done.state, done.error, done.owner, done.takeovers], ['succeeded', null, b.manager.replica, 1]);
    assert.equal(peer.requests.filter((r) => r.replica === a.manager.replica).length, askedByA);
    const audit = (await call(a.url, 'GET', `/api/v1/audit?limit=20`, { token: ADMIN_TOKEN })).body as Array<{
      action: string;
      target: string;
    }>;
    assert.deepEqual(
      audit
        .filter((e) => e.target === `job:${created.body.id}`)
        .map((e) => e.action)
        .reverse(),
      ['job.create', 'job.takeover', 'job.succeed'],
    );
  });
});
