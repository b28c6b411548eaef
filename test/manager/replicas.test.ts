// Three `starling manager` processes on one real PostgreSQL, as the Kubernetes `ha` layout runs
// them (TLS between all components, from the cluster CA), with a real registry, scheduler and two
// seed peers (their origin reads slowed so that a preheat runs for seconds) reaching the managers
// through a load balancer, as through a Service.
// Proves: replicas started together on an empty database migrate once and all serve; a setting
// changed through one replica reaches the scheduler through every replica, and a change of scopes
// reaches peers through every replica; a preheat survives the other replicas' rolling restart
// untouched, its own replica's SIGKILL (another takes it over within the lease time) and its own
// replica's SIGTERM (given up, taken over at once), and no seed is asked for a blob twice; every
// replica shows the same jobs, peers and settings throughout; readiness follows the database and
// its schema; the console works over TLS against any replica with a token made through another.
import assert from 'node:assert/strict';
import { createHash, createPublicKey, randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import { hostname } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import pg from 'pg';
import { chromium } from 'playwright-core';
import type { Agent } from 'undici';
import { itemAt } from '../../src/common/indexing.js';
import { startBalancer, type Balancer } from '../fixtures/balancer.js';
import { buildImage, pushImage, type BuiltImage } from '../fixtures/images.js';
import {
  clusterToken,
  STARLING_CLI,
  startPeer,
  startScheduler,
  type RunningPeerProcess,
  type RunningSchedulerProcess,
} from '../fixtures/peer.js';
import { freePort, makeTempDir, spawnService, waitFor, type Service, type TempDir } from '../fixtures/processes.js';
import { startRegistry, type Registry } from '../fixtures/registry.js';
import { clusterAgent, testTlsFiles, tlsArgs } from '../fixtures/tls.js';
import { call } from './helpers.js';
import { startPostgres, type Postgres } from './postgres.js';

const MiB = 1024 * 1024;
const IP = '127.0.4.1';
const SCHEDULER_IP = '127.0.4.2';
const LEASE_MS = 2_000;
/** Each seed reads the registry at this rate: a 12 MiB layer takes 4 s, a 24 MiB one 8 s. */
const SEED_ORIGIN_RATE = '3MB';
/** Rolling: long enough for two replica restarts (1.3-2.8 s each here, busy machine included). */
const LAYER_SIZES = { rolling: 24 * MiB, killed: 12 * MiB, stopped: 12 * MiB };
const CHROMIUM = '/usr/bin/chromium';
/** A scheduler keeps alive every 5 s (scheduler/manager-link.ts); a slow round on a busy machine. */
const SCHEDULER_KEEPALIVE_WAIT_MS = 12_000;

interface Replica {
  port: number;
  url: string;
  service: Service;
  /** Its name in the jobs it holds (from /readyz). */
  name: string;
}

interface AuditEntry {
  action: string;
  target: string;
  detail: Record<string, unknown>;
}

describe('three manager replicas on one PostgreSQL, TLS between the components', { timeout: 240_000 }, () => {
  let work: TempDir;
  let postgres: Postgres;
  let databaseUrl: string;
  let registry: Registry;
  let balancer: Balancer;
  let scheduler: RunningSchedulerProcess;
  /** Trusts the cluster CA: every replica serves https. */
  let agent: Agent;
  let tls: string[];
  const replicas: Replica[] = [];
  const seeds: RunningPeerProcess[] = [];
  const images = new Map<string, { ref: string; blobs: string[] }>();
  const imageOf = (name: string) => {
    const image = images.get(name);
    assert.ok(image, `the ${name} image was pushed`);
    return image;
  };
  const adminToken = `admin-${randomBytes(16).toString('hex')}`;
  const clusterSecret = randomBytes(24).toString('hex');
  const stops: Array<() => Promise<unknown>> = [];
  let clusterTokenFile: string;

  const api = (replica: Replica, method: string, pathname: string, body?: unknown, token = adminToken) =>
    call(replica.url, method, `/api/v1${pathname}`, { token, body, dispatcher: agent });
  const probe = (replica: Replica, pathname: string) => call(replica.url, 'GET', pathname, { dispatcher: agent });
  /** A keep-alive as a scheduler or peer sends it, with the cluster token, straight to each of `to`: their answers. */
  async function keepalives(to: Replica[], who: 'schedulers' | 'peers', body: unknown): Promise<unknown[]> {
    const out = [];
    for (const r of to) {
      const answer = await call(r.url, 'POST', `/api/v1/${who}/keepalive`, { token: clusterSecret, body, dispatcher: agent });
      assert.equal(answer.status, 200, `${r.url}: ${JSON.stringify(answer.body)}`);
      out.push(answer.body);
    }
    return out;
  }

  /** Starts a replica process on `port` and waits until it is ready. */
  async function startReplica(port: number, name = 'replica'): Promise<Replica> {
    const service = await spawnService({
      cmd: process.execPath,
      args: [
        STARLING_CLI,
        'manager',
        '--listen',
        `${IP}:${port}`,
        '--db',
        databaseUrl,
        '--cluster-token-file',
        clusterTokenFile,
        '--admin-token-file',
        path.join(work.path, 'admin.token'),
        '--insecure-registry',
        registry.host,
        '--job-lease-ms',
        String(LEASE_MS),
        '--log-level',
        'info',
        ...tls,
      ],
      name: `starling-manager-${name}`,
    });
    const url = `https://${IP}:${port}`;
    const ready = await waitFor(
      async () => {
        if (!service.running) throw new Error(`${name} exited: ${service.logTail()}`);
        const answer = await call(url, 'GET', '/readyz', { dispatcher: agent });
        return answer.status === 200 ? (answer.body as { replica: string }) : undefined;
      },
      30_000,
      `${name} ready`,
      50,
      (error) => (error as Error).message.includes('exited'),
    );
    return { port, url, service, name: ready.replica };
  }

  async function restart(index: number): Promise<void> {
    const old = itemAt(replicas, index);
    if (old.service.running) await old.service.stop();
    replicas[index] = await startReplica(old.port, `r${index + 1}`);
  }

  /** Waits for a job to end, asking whichever replicas are up. */
  async function finished(id: number) {
    return waitFor(
      async () => {
        for (const r of replicas.filter((r) => r.service.running)) {
          const job = await api(r, 'GET', `/jobs/${id}`).catch(() => undefined);
          if (job?.status === 200 && (job.body.state === 'succeeded' || job.body.state === 'failed')) return job.body;
        }
        return undefined;
      },
      60_000,
      `job ${id} to end`,
      100,
    );
  }

  /** Starts a preheat of one of the images through `replica`, on the seeds. */
  async function preheat(replica: Replica, name: keyof typeof LAYER_SIZES) {
    const created = await api(replica, 'POST', '/jobs', {
      type: 'preheat',
      image: imageOf(name).ref,
      platform: 'linux/amd64',
      scope: 'seeds',
    });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    return created.body as { id: number; args: unknown; createdAt: string; layers: unknown[] };
  }

  /** The audit log's actions on one job, oldest first. */
  async function jobAudit(replica: Replica, id: number): Promise<AuditEntry[]> {
    const audit = (await api(replica, 'GET', '/audit?limit=200')).body as AuditEntry[];
    return audit.filter((a) => a.target === `job:${id}`).reverse();
  }

  /** Preheat triggers the seeds accepted, per seed, from their own metrics. */
  const triggersAccepted = () =>
    Promise.all(seeds.map((s) => s.metric('starling_peer_upload_requests_total', { kind: 'preheat', outcome: 'accepted' })));

  /** Lines of a JSON log with this message. */
  const logged = (service: Service, msg: string) =>
    service
      .readLog()
      .split('\n')
      .filter((line) => line.includes(`"msg":"${msg}"`))
      .map((line) => JSON.parse(line) as Record<string, unknown>);

  before(async () => {
    work = await makeTempDir('starling-replicas-');
    const names = Object.keys(LAYER_SIZES) as Array<keyof typeof LAYER_SIZES>;
    let built: BuiltImage[];
    [postgres, registry, built, agent, tls] = await Promise.all([
      startPostgres(),
      startRegistry({ host: '127.0.4.9' }),
      Promise.all(names.map((name) => buildImage({ layers: [{ sizeBytes: LAYER_SIZES[name], seed: `replicas-${name}` }] }))),
      clusterAgent(),
      tlsArgs(),
    ]);
    stops.push(() => registry.stop());
    for (const [i, name] of names.entries()) {
      const image = itemAt(built, i);
      await pushImage(image.layoutDir, image.tag, registry.host, `ha/${name}:v1`);
      images.set(name, { ref: `${registry.host}/ha/${name}:v1`, blobs: image.layers.map((l) => l.digest) });
    }
    databaseUrl = await postgres.createDatabase();
    clusterTokenFile = path.join(work.path, 'cluster.token');
    await writeFile(clusterTokenFile, clusterSecret);
    await writeFile(path.join(work.path, 'admin.token'), adminToken);
  });

  after(async () => {
    for (const stop of stops.reverse()) await stop().catch(() => undefined);
    for (const r of replicas) await r.service.stop().catch(() => undefined);
    await balancer?.close();
    await postgres?.stop();
    await agent?.close();
    await work?.remove();
  });

  it('three replicas started at the same moment on an empty database: one set of migrations, one admin, all ready', async () => {
    const ports = await Promise.all([1, 2, 3].map(() => freePort(IP)));
    replicas.push(...(await Promise.all(ports.map((port, i) => startReplica(port, `r${i + 1}`)))));
    const migrated = replicas.filter((r) => /"msg":"database migrated"/.test(r.service.readLog()));
    const current = replicas.filter((r) => /"msg":"database schema already current"/.test(r.service.readLog()));
    assert.equal(migrated.length, 1, 'one replica migrated');
    assert.equal(current.length, 2, 'the others found the schema current');

    const db = new pg.Client({ connectionString: databaseUrl });
    await db.connect();
    try {
      const count = async (query: string) => Number((await db.query(query)).rows[0].n);
      assert.equal(await count('SELECT count(*) AS n FROM starling_migrations'), 2);
      assert.equal(await count(`SELECT count(*) AS n FROM users WHERE name = 'admin'`), 1);
      assert.equal(await count(`SELECT count(*) AS n FROM audit_log WHERE action = 'user.create'`), 1);
      assert.equal(await count('SELECT count(*) AS n FROM scheduler_clusters'), 1);
    } finally {
      await db.end();
    }
    for (const r of replicas) {
      assert.equal((await api(r, 'GET', '/me')).body.user.name, 'admin');
      assert.equal((await probe(r, '/healthz')).status, 200);
    }
    assert.equal(new Set(replicas.map((r) => r.name)).size, 3, 'each replica has its own name');

    // The swarm reaches "the manager" through a balancer, as through a Kubernetes Service.
    balancer = await startBalancer(IP, () => replicas.filter((r) => r.service.running).map((r) => `${IP}:${r.port}`), { tls: true });
    scheduler = await startScheduler({ ip: SCHEDULER_IP, clusterTokenFile, extraArgs: ['--manager', balancer.url, ...tls] });
    stops.push(() => scheduler.stop());
    await waitFor(
      async () => (await api(itemAt(replicas, 0), 'GET', '/schedulers?state=active')).body.length === 1,
      20_000,
      'the scheduler registered',
    );
    for (const ip of ['127.0.4.3', '127.0.4.4']) {
      const seed = await startPeer({
        ip,
        insecure: [registry.host],
        extraArgs: [
          '--manager',
          balancer.url,
          '--upload-listen',
          `${ip}:0`,
          '--cluster-token-file',
          clusterTokenFile,
          '--host-id',
          `seed-${ip}`,
          '--seed',
          '--download-rate-limit',
          SEED_ORIGIN_RATE,
          ...tls,
        ],
      });
      stops.push(() => seed.stop());
      seeds.push(seed);
    }
    await waitFor(
      async () => (await api(itemAt(replicas, 2), 'GET', '/peers?state=active')).body.length === 2,
      20_000,
      'both seeds registered',
    );
  });

  it("a setting changed through one replica reaches the scheduler through every replica: the others' keep-alive answers carry it, and the scheduler applies it", async () => {
    const [r1, r2, r3] = [itemAt(replicas, 0), itemAt(replicas, 1), itemAt(replicas, 2)];
    // The keep-alive the scheduler sends, straight to each replica that will not take the change.
    const [schedulerIp, schedulerPort] = scheduler.address.split(':');
    const answers = () => keepalives([r1, r3], 'schedulers', { hostname: hostname(), ip: schedulerIp, port: Number(schedulerPort) });
    const before = (await api(r1, 'GET', '/clusters/1')).body;
    assert.notEqual(before.config.backToSourceLimit, 7);
    const asSent = (cluster: { config: unknown; configVersion: number }) => ({
      clusterId: 1,
      config: cluster.config,
      configVersion: cluster.configVersion,
    });
    assert.deepEqual(await answers(), [asSent(before), asSent(before)], 'r1 and r3 before the change');

    const patched = await api(r2, 'PATCH', '/clusters/1/config', { backToSourceLimit: 7 });
    assert.equal(patched.status, 200, JSON.stringify(patched.body));
    assert.equal(patched.body.configVersion, before.configVersion + 1);
    assert.deepEqual(await answers(), [asSent(patched.body), asSent(patched.body)], 'r1 and r3 after the change through r2');

    // The scheduler itself, keeping alive through the balancer, applies the new version.
    const applied = await waitFor(
      async () =>
        logged(scheduler.service, 'scheduling settings from the manager applied').find((l) => l.version === patched.body.configVersion),
      SCHEDULER_KEEPALIVE_WAIT_MS,
      `the scheduler applying settings version ${patched.body.configVersion}`,
      100,
    );
    assert.deepEqual(applied.config, patched.body.config);
  });

  it('a preheat through one replica while the others restart one by one: succeeded once, no error; every replica shows the same job, peers and settings throughout', async (t) => {
    const [r1, r2] = [itemAt(replicas, 0), itemAt(replicas, 1)];
    const settings = (await api(r2, 'GET', '/clusters/1')).body;
    assert.equal(settings.config.backToSourceLimit, 7, 'the setting changed through r2');
    const triggersBefore = await triggersAccepted();
    const created = await preheat(r1, 'rolling');
    const id = created.id;

    // Every replica that is up, asked over and over while the others restart, tells the same story.
    let watching = true;
    let samples = 0;
    const seenStates = new Set<string>();
    const watcher = (async () => {
      while (watching) {
        for (const r of replicas.filter((r) => r.service.running)) {
          const answers = await Promise.all([api(r, 'GET', `/jobs/${id}`), api(r, 'GET', '/peers'), api(r, 'GET', '/clusters/1')]).catch(
            () => undefined,
          );
          // A replica stopping (503 once it closes) or starting (refused) is not asked this round.
          if (!answers || answers.some((a) => a.status !== 200)) continue;
          const [job, peers, cluster] = answers;
          const { state, owner, error, takeovers, args, createdAt, createdBy } = job.body;
          seenStates.add(state);
          assert.deepEqual(
            { owner, error, takeovers, args, createdAt, createdBy },
            {
              owner: r1.name,
              error: null,
              takeovers: 0,
              args: created.args,
              createdAt: created.createdAt,
              createdBy: 'user:admin',
            },
            `job as ${r.url} shows it`,
          );
          assert.deepEqual(
            peers.body.map((p: { hostId: string; type: string; state: string }) => [p.hostId, p.type, p.state]),
            seeds.map((s) => [`seed-${s.host.split(':')[0]}`, 'seed', 'active']),
            `peers as ${r.url} shows them`,
          );
          assert.deepEqual(cluster.body, settings, `settings as ${r.url} shows them`);
          samples++;
        }
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    })();
    // A difference seen ends the test after the restarts, not while one of them is half done.
    watcher.catch(() => undefined);
    try {
      await waitFor(async () => (await api(r1, 'GET', `/jobs/${id}`)).body.state === 'running', 10_000, 'the job running');
      const restartsBegan = Date.now();
      await restart(1);
      assert.equal((await api(r1, 'GET', `/jobs/${id}`)).body.state, 'running', 'the second restart begins while the job runs');
      await restart(2);
      t.diagnostic(`two rolling restarts took ${Date.now() - restartsBegan} ms`);
      const done = await finished(id);
      assert.equal(done.state, 'succeeded', done.error ?? '');
      assert.equal(done.error, null);
    } finally {
      watching = false;
      await watcher;
    }
    assert.ok(samples >= 10, `${samples} samples`);
    assert.ok(seenStates.has('running'), [...seenStates].join());
    for (const r of replicas) {
      const job = (await api(r, 'GET', `/jobs/${id}`)).body;
      assert.deepEqual([job.state, job.error, job.owner, job.takeovers], ['succeeded', null, r1.name, 0]);
    }
    assert.deepEqual(
      (await jobAudit(itemAt(replicas, 2), id)).map((a) => a.action),
      ['job.create', 'job.succeed'],
    );
    const blobs = created.layers.length;
    assert.equal(blobs, imageOf('rolling').blobs.length + 1, 'the layers and the config');
    assert.deepEqual(
      (await triggersAccepted()).map((n, i) => n - itemAt(triggersBefore, i)),
      seeds.map(() => blobs),
      'each seed asked once per blob',
    );
  });

  /**
   * The job's owner leaves while the job runs: `leave` stops it (and returns when it is gone).
   * Another replica takes the job over and finishes it; each seed is asked once per blob; one
   * survivor took it. Then the owner's replica starts again. Returns the takeover's audit entry,
   * when it came (ms after `leave` began), and how the owner's process ended.
   */
  async function ownerLeaves(ownerIndex: number, image: keyof typeof LAYER_SIZES, leave: (owner: Replica) => Promise<unknown>) {
    const owner = itemAt(replicas, ownerIndex);
    const survivors = replicas.filter((r) => r !== owner);
    const triggersBefore = await triggersAccepted();
    const created = await preheat(owner, image);
    const id = created.id;
    await waitFor(async () => (await api(owner, 'GET', `/jobs/${id}`)).body.progress.bytes > 0, 10_000, 'the job under way');

    const leftAt = Date.now();
    const gone = leave(owner);
    const taken = await waitFor(
      async () => {
        const job = (await api(itemAt(survivors, 0), 'GET', `/jobs/${id}`)).body;
        return job.owner !== owner.name ? job : undefined;
      },
      LEASE_MS * 3,
      'another replica taking the job over',
      50,
    );
    const tookMs = Date.now() - leftAt;
    const exit = await gone;
    assert.ok(
      survivors.some((r) => r.name === taken.owner),
      `${taken.owner} is a live replica`,
    );
    assert.equal(taken.takeovers, 1);

    const done = await finished(id);
    assert.deepEqual([done.state, done.error, done.owner, done.takeovers], ['succeeded', null, taken.owner, 1]);
    const forJob = await jobAudit(itemAt(survivors, 1), id);
    assert.deepEqual(
      forJob.map((a) => a.action),
      ['job.create', 'job.takeover', 'job.succeed'],
    );
    const takeover = itemAt(forJob, 1);
    assert.deepEqual([takeover.detail.from, takeover.detail.to], [owner.name, taken.owner]);
    const blobs = created.layers.length;
    assert.deepEqual(
      (await triggersAccepted()).map((n, i) => n - itemAt(triggersBefore, i)),
      seeds.map(() => blobs),
      'each seed asked once per blob, by the replica that left; the new owner asked how it went',
    );
    const tookIt = survivors.filter((r) =>
      logged(r.service, 'took over a job whose lease had run out (its replica died, lost the database or stopped)').some(
        (l) => l.job === id,
      ),
    );
    assert.deepEqual(
      tookIt.map((r) => r.name),
      [taken.owner],
      'one survivor took the job; the other left it alone',
    );
    await restart(ownerIndex);
    return { takeover, tookMs, exit };
  }

  it('the replica running a job is killed with SIGKILL: another takes it over within the lease time, no seed is asked for a blob twice, the job succeeds', async (t) => {
    const { tookMs } = await ownerLeaves(0, 'killed', (owner) => owner.service.kill9());
    t.diagnostic(`taken over ${tookMs} ms after the SIGKILL (lease ${LEASE_MS} ms)`);
    // The lease ran out at most LEASE_MS after the kill; a look comes every third of it.
    assert.ok(tookMs <= LEASE_MS + LEASE_MS / 3 + 1_500, `taken over ${tookMs} ms after the kill`);
  });

  it('the replica running a job is stopped with SIGTERM, as in a rolling update: it gives the job up, another takes it over well within the lease, no seed is asked for a blob twice, the job succeeds', async (t) => {
    const { takeover, tookMs, exit } = await ownerLeaves(1, 'stopped', (owner) => owner.service.stop());
    t.diagnostic(`taken over ${tookMs} ms after the SIGTERM (lease ${LEASE_MS} ms)`);
    assert.deepEqual(exit, { code: 0, signal: null }, 'the replica shut down by itself, within the grace time');
    // Given up as it stopped (its lease set to 0), not left to run out.
    assert.equal(takeover.detail.leaseExpiredAt, new Date(0).toISOString());
    // The release, then a survivor's next look (every third of the lease).
    assert.ok(tookMs <= LEASE_MS / 3 + 1_000, `taken over ${tookMs} ms after the SIGTERM`);
  });

  it('readiness fails on every replica while the schema is behind or the database is down (liveness does not), and comes back with it', async () => {
    const notReady = async (reason: RegExp) => {
      for (const r of replicas) {
        const answer = await probe(r, '/readyz');
        assert.equal(answer.status, 503, `${r.url}: ${JSON.stringify(answer.body)}`);
        assert.match(answer.body.reason, reason);
        assert.equal((await probe(r, '/healthz')).status, 200);
      }
    };
    const allReady = async () => {
      for (const r of replicas) {
        await waitFor(async () => (await probe(r, '/readyz')).status === 200, 15_000, `${r.url} ready again`, 100);
        assert.equal((await api(r, 'GET', '/jobs')).status, 200);
      }
    };

    // As after restoring a backup taken before the last migration.
    const db = new pg.Client({ connectionString: databaseUrl });
    await db.connect();
    try {
      const { rows } = await db.query(`DELETE FROM starling_migrations WHERE name = '002-job-leases' RETURNING *`);
      assert.equal(rows.length, 1);
      try {
        await notReady(/^the database schema is behind this manager: it lacks 002-job-leases$/);
      } finally {
        const columns = Object.keys(rows[0]);
        await db.query(
          `INSERT INTO starling_migrations (${columns.map((c) => `"${c}"`).join(', ')}) VALUES (${columns.map((_, i) => `$${i + 1}`).join(', ')})`,
          columns.map((c) => rows[0][c]),
        );
      }
    } finally {
      await db.end();
    }
    await allReady();

    await postgres.stopServer();
    try {
      await notReady(/^the database is unreachable: /);
    } finally {
      await postgres.startServer();
    }
    await allReady();
  });

  it('the console works over TLS against any replica, with a token made through another', async () => {
    assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: run scripts/install-deps.sh (Debian package chromium)`);
    const user = await api(itemAt(replicas, 1), 'POST', '/users', { name: 'watcher', role: 'read-only' });
    assert.equal(user.status, 201, JSON.stringify(user.body));
    const made = await api(itemAt(replicas, 1), 'POST', '/tokens', { name: 'through r2', userId: user.body.id });
    assert.equal(made.status, 201, JSON.stringify(made.body));
    const token = made.body.token as string;
    const jobs = (await api(itemAt(replicas, 0), 'GET', '/jobs')).body as Array<{
      id: number;
      state: string;
      owner: string;
      takeovers: number;
    }>;
    assert.equal(jobs.length, 3);

    // The browser trusts the replicas' certificate, and no other (it is not issued for 127.0.4.1).
    const { cert } = await testTlsFiles();
    const spki = createHash('sha256')
      .update(createPublicKey(await readFile(cert)).export({ type: 'spki', format: 'der' }))
      .digest('base64');
    const browser = await chromium.launch({
      executablePath: CHROMIUM,
      headless: true,
      args: ['--no-sandbox', '--disable-background-networking', `--ignore-certificate-errors-spki-list=${spki}`],
    });
    try {
      for (const r of replicas) {
        assert.equal((await api(r, 'GET', '/me', undefined, token)).body.user.name, 'watcher');
        const page = await (await browser.newContext()).newPage();
        await page.goto(r.url);
        await page.getByLabel('Personal access token').fill(token);
        await page.getByRole('button', { name: 'Log in' }).click();
        await page.getByRole('heading', { name: 'Overview' }).waitFor();
        await page.getByRole('navigation', { name: 'Pages' }).getByRole('link', { name: 'Jobs', exact: true }).click();
        const rows = page.getByRole('table', { name: 'jobs' }).locator('tbody tr');
        await waitFor(async () => (await rows.count()) === jobs.length, 10_000, `the jobs listed by ${r.url}`);
        for (const job of jobs) assert.match(await rows.filter({ hasText: `#${job.id}` }).innerText(), /succeeded/);
        // A job whose replica left: who finished it, and that it was taken over.
        const takenOver = jobs.find((j) => j.takeovers === 1);
        assert.ok(takenOver, `a job taken over, among ${JSON.stringify(jobs)}`);
        await page.goto(`${r.url}/jobs/${takenOver.id}`);
        await page.getByRole('heading', { name: `Job #${takenOver.id}` }).waitFor();
        assert.equal(await page.getByTestId('job-owner').innerText(), `${takenOver.owner} (taken over once)`);
        await page.context().close();
      }
    } finally {
      await browser.close();
    }
  });

  it("a change of a cluster's scopes through one replica reaches peers through every replica: the others' keep-alive answers name the new cluster and its schedulers", async () => {
    const [r1, r2, r3] = [itemAt(replicas, 0), itemAt(replicas, 1), itemAt(replicas, 2)];
    // A peer in zone b (not a seed: the seeds, without a zone, stay where they are).
    const peer = {
      hostId: 'peer-zone-b',
      hostname: 'node-b1',
      ip: '127.0.4.5',
      uploadPort: 65002,
      mirrorUrl: 'http://127.0.4.5:65001',
      labels: { zone: 'b' },
      seed: false,
    };
    const answers = () => keepalives([r1, r3], 'peers', peer);
    assert.deepEqual(
      await answers(),
      [1, 2].map(() => ({ clusterId: 1, schedulers: [scheduler.address] })),
    );

    const zoneB = await api(r2, 'POST', '/clusters', { name: 'zone-b', scopes: { zones: ['b'] } });
    assert.equal(zoneB.status, 201, JSON.stringify(zoneB.body));
    assert.deepEqual(
      await answers(),
      [1, 2].map(() => ({ clusterId: zoneB.body.id, schedulers: [] })),
      'moved to zone-b, which has no scheduler yet',
    );

    const moved = await api(r2, 'PATCH', `/clusters/${zoneB.body.id}`, { scopes: { zones: ['c'] } });
    assert.equal(moved.status, 200, JSON.stringify(moved.body));
    assert.deepEqual(
      await answers(),
      [1, 2].map(() => ({ clusterId: 1, schedulers: [scheduler.address] })),
      'back in the default cluster',
    );
    assert.equal((await api(r2, 'DELETE', `/clusters/${zoneB.body.id}`)).status, 204);
  });
});

describe('three replicas on one SQLite file, started at the same moment', () => {
  it('all serve; the schema and the admin are made once', async () => {
    const work = await makeTempDir('starling-replicas-sqlite-');
    const services: Service[] = [];
    try {
      const db = `sqlite:${path.join(work.path, 'manager.db')}`;
      const ports = await Promise.all([1, 2, 3].map(() => freePort()));
      const token = (await clusterToken()).file;
      services.push(
        ...(await Promise.all(
          ports.map((port) =>
            spawnService({
              cmd: process.execPath,
              args: [
                STARLING_CLI,
                'manager',
                '--listen',
                `127.0.0.1:${port}`,
                '--db',
                db,
                '--cluster-token-file',
                token,
                '--log-level',
                'info',
              ],
              name: 'starling-manager-sqlite',
            }),
          ),
        )),
      );
      for (const [i, port] of ports.entries()) {
        const service = itemAt(services, i);
        await waitFor(
          async () => {
            if (!service.running) throw new Error(`a replica exited: ${service.logTail()}`);
            return (await call(`http://127.0.0.1:${port}`, 'GET', '/readyz')).status === 200;
          },
          20_000,
          'replica ready',
          50,
          (error) => (error as Error).message.includes('exited'),
        );
      }
      const logs = services.map((s) => s.readLog());
      assert.equal(logs.filter((l) => /"msg":"database migrated"/.test(l)).length, 1);
      assert.equal(logs.filter((l) => /Initial admin token/.test(l)).length, 1, 'one admin token printed, by the replica that made it');
    } finally {
      await Promise.all(services.map((s) => s.stop()));
      await work.remove();
    }
  });
});
