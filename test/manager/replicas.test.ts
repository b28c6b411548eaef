// Three `starling manager` processes on one real PostgreSQL, as the Kubernetes `ha` layout runs
// them, with a real registry, scheduler and two seed peers (their origin reads slowed so that a
// preheat runs for seconds) reaching the managers through a load balancer, as through a Service.
// Proves: replicas started together on an empty database migrate once and all serve; a preheat
// survives the other replicas' rolling restart untouched, and its own replica's SIGKILL (another
// takes it over within the lease time, and no seed is asked for a blob twice); every replica shows
// the same jobs, peers and settings throughout; readiness follows the database; the console works
// against any replica with a token made through another.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import pg from 'pg';
import { chromium } from 'playwright-core';
import { startBalancer, type Balancer } from '../fixtures/balancer.js';
import { buildImage, pushImage, type BuiltImage } from '../fixtures/images.js';
import { clusterToken, STARLING_CLI, startPeer, startScheduler, type RunningPeerProcess } from '../fixtures/peer.js';
import { freePort, makeTempDir, spawnService, waitFor, type Service, type TempDir } from '../fixtures/processes.js';
import { startRegistry, type Registry } from '../fixtures/registry.js';
import { call } from './helpers.js';
import { startPostgres, type Postgres } from './postgres.js';

const MiB = 1024 * 1024;
const IP = '127.0.4.1';
const LEASE_MS = 2_000;
/** Each seed reads the registry at this rate: a 12 MiB layer takes 4 s, a 24 MiB one 8 s. */
const SEED_ORIGIN_RATE = '3MB';
/** Rolling: long enough for two replica restarts (1.3-2.8 s each here, busy machine included). */
const LAYER_SIZES = { rolling: 24 * MiB, killed: 12 * MiB };
const CHROMIUM = '/usr/bin/chromium';

interface Replica {
  port: number;
  url: string;
  service: Service;
  /** Its name in the jobs it holds (from /readyz). */
  name: string;
}

describe('three manager replicas on one PostgreSQL', { timeout: 240_000 }, () => {
  let work: TempDir;
  let postgres: Postgres;
  let databaseUrl: string;
  let registry: Registry;
  let balancer: Balancer;
  const replicas: Replica[] = [];
  const seeds: RunningPeerProcess[] = [];
  const images = new Map<string, { ref: string; blobs: string[] }>();
  const adminToken = `admin-${randomBytes(16).toString('hex')}`;
  const stops: Array<() => Promise<unknown>> = [];
  let clusterTokenFile: string;

  const api = (replica: Replica, method: string, pathname: string, body?: unknown, token = adminToken) =>
    call(replica.url, method, `/api/v1${pathname}`, { token, body });

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
      ],
      name: `starling-manager-${name}`,
    });
    const url = `http://${IP}:${port}`;
    const ready = await waitFor(
      async () => {
        if (!service.running) throw new Error(`${name} exited: ${service.logTail()}`);
        const answer = await call(url, 'GET', '/readyz');
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
    const old = replicas[index]!;
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

  /** Preheat triggers the seeds accepted, per seed, from their own metrics. */
  const triggersAccepted = () =>
    Promise.all(seeds.map((s) => s.metric('starling_peer_upload_requests_total', { kind: 'preheat', outcome: 'accepted' })));

  before(async () => {
    work = await makeTempDir('starling-replicas-');
    const names = ['rolling', 'killed'] as const;
    let built: BuiltImage[];
    [postgres, registry, built] = await Promise.all([
      startPostgres(),
      startRegistry({ host: '127.0.4.9' }),
      Promise.all(names.map((name) => buildImage({ layers: [{ sizeBytes: LAYER_SIZES[name], seed: `replicas-${name}` }] }))),
    ]);
    stops.push(() => registry.stop());
    for (const [i, name] of names.entries()) {
      const image = built[i]!;
      await pushImage(image.layoutDir, image.tag, registry.host, `ha/${name}:v1`);
      images.set(name, { ref: `${registry.host}/ha/${name}:v1`, blobs: image.layers.map((l) => l.digest) });
    }
    databaseUrl = await postgres.createDatabase();
    clusterTokenFile = path.join(work.path, 'cluster.token');
    await writeFile(clusterTokenFile, randomBytes(24).toString('hex'));
    await writeFile(path.join(work.path, 'admin.token'), adminToken);
  });

  after(async () => {
    for (const stop of stops.reverse()) await stop().catch(() => undefined);
    for (const r of replicas) await r.service.stop().catch(() => undefined);
    await balancer?.close();
    await postgres?.stop();
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
      assert.equal((await call(r.url, 'GET', '/healthz')).status, 200);
    }
    assert.equal(new Set(replicas.map((r) => r.name)).size, 3, 'each replica has its own name');

    // The swarm reaches "the manager" through a balancer, as through a Kubernetes Service.
    balancer = await startBalancer(IP, () => replicas.filter((r) => r.service.running).map((r) => `${IP}:${r.port}`));
    const scheduler = await startScheduler({ ip: '127.0.4.2', clusterTokenFile, extraArgs: ['--manager', balancer.url] });
    stops.push(() => scheduler.stop());
    await waitFor(
      async () => (await api(replicas[0]!, 'GET', '/schedulers?state=active')).body.length === 1,
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
        ],
      });
      stops.push(() => seed.stop());
      seeds.push(seed);
    }
    await waitFor(async () => (await api(replicas[2]!, 'GET', '/peers?state=active')).body.length === 2, 20_000, 'both seeds registered');
  });

  it('a preheat through one replica while the others restart one by one: succeeded once, no error; every replica shows the same job, peers and settings throughout', async (t) => {
    const [r1, r2] = [replicas[0]!, replicas[1]!];
    const patched = await api(r2, 'PATCH', '/clusters/1/config', { backToSourceLimit: 7 });
    assert.equal(patched.status, 200, JSON.stringify(patched.body));
    const settings = patched.body;
    const image = images.get('rolling')!;
    const triggersBefore = await triggersAccepted();
    const created = await api(r1, 'POST', '/jobs', { type: 'preheat', image: image.ref, platform: 'linux/amd64', scope: 'seeds' });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    const id = created.body.id as number;

    // Every replica that is up, asked over and over while the others restart, tells the same story.
    let watching = true;
    let samples = 0;
    const seenStates = new Set<string>();
    const watcher = (async () => {
      while (watching) {
        for (const r of replicas.filter((r) => r.service.running)) {
          const [job, peers, cluster] = await Promise.all([
            api(r, 'GET', `/jobs/${id}`),
            api(r, 'GET', '/peers'),
            api(r, 'GET', '/clusters/1'),
          ]).catch(() => []);
          if (job?.status !== 200) continue; // stopping or starting
          const { state, owner, error, takeovers, args, createdAt, createdBy } = job.body;
          seenStates.add(state);
          assert.deepEqual(
            { owner, error, takeovers, args, createdAt, createdBy },
            {
              owner: r1.name,
              error: null,
              takeovers: 0,
              args: created.body.args,
              createdAt: created.body.createdAt,
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
    const audit = (await api(replicas[2]!, 'GET', '/audit?limit=200')).body as Array<{ action: string; target: string }>;
    assert.deepEqual(
      audit
        .filter((a) => a.target === `job:${id}`)
        .map((a) => a.action)
        .reverse(),
      ['job.create', 'job.succeed'],
    );
    const blobs = created.body.layers.length;
    assert.equal(blobs, image.blobs.length + 1, 'the layers and the config');
    assert.deepEqual(
      (await triggersAccepted()).map((n, i) => n - triggersBefore[i]!),
      seeds.map(() => blobs),
      'each seed asked once per blob',
    );
  });

  it('the replica running a job is killed with SIGKILL: another takes it over within the lease time, no seed is asked for a blob twice, the job succeeds', async (t) => {
    const image = images.get('killed')!;
    const triggersBefore = await triggersAccepted();
    const created = await api(replicas[0]!, 'POST', '/jobs', {
      type: 'preheat',
      image: image.ref,
      platform: 'linux/amd64',
      scope: 'seeds',
    });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    const id = created.body.id as number;
    const owner = replicas[0]!;
    await waitFor(async () => (await api(owner, 'GET', `/jobs/${id}`)).body.progress.bytes > 0, 10_000, 'the job under way');

    await owner.service.kill9();
    const killedAt = Date.now();
    const survivors = [replicas[1]!, replicas[2]!];
    const taken = await waitFor(
      async () => {
        const job = (await api(survivors[0]!, 'GET', `/jobs/${id}`)).body;
        return job.owner !== owner.name ? job : undefined;
      },
      LEASE_MS * 3,
      'another replica taking the job over',
      50,
    );
    const tookMs = Date.now() - killedAt;
    t.diagnostic(`taken over ${tookMs} ms after the SIGKILL (lease ${LEASE_MS} ms)`);
    // The lease ran out at most LEASE_MS after the kill; a look comes every third of it.
    assert.ok(tookMs <= LEASE_MS + LEASE_MS / 3 + 1_500, `taken over ${tookMs} ms after the kill`);
    assert.ok(
      survivors.some((r) => r.name === taken.owner),
      `${taken.owner} is a live replica`,
    );
    assert.equal(taken.takeovers, 1);

    const done = await finished(id);
    assert.deepEqual([done.state, done.error, done.owner, done.takeovers], ['succeeded', null, taken.owner, 1]);
    const audit = (await api(survivors[1]!, 'GET', '/audit?limit=200')).body as Array<{
      action: string;
      target: string;
      detail: Record<string, unknown>;
    }>;
    const forJob = audit.filter((a) => a.target === `job:${id}`).reverse();
    assert.deepEqual(
      forJob.map((a) => a.action),
      ['job.create', 'job.takeover', 'job.succeed'],
    );
    assert.deepEqual([forJob[1]!.detail.from, forJob[1]!.detail.to], [owner.name, taken.owner]);
    const blobs = created.body.layers.length;
    assert.deepEqual(
      (await triggersAccepted()).map((n, i) => n - triggersBefore[i]!),
      seeds.map(() => blobs),
      'each seed asked once per blob, by the dead replica; the new owner asked how it went',
    );
    const other = survivors.find((r) => r.name !== taken.owner)!;
    assert.doesNotMatch(other.service.readLog(), /took over a job/, 'the other survivor left it alone');

    await restart(0);
  });

  it('readiness fails on every replica while the database is down (liveness does not), and comes back with it', async () => {
    await postgres.stopServer();
    try {
      for (const r of replicas) {
        const answer = await call(r.url, 'GET', '/readyz');
        assert.equal(answer.status, 503);
        assert.match(answer.body.reason, /^the database is unreachable: /);
        assert.equal((await call(r.url, 'GET', '/healthz')).status, 200);
      }
    } finally {
      await postgres.startServer();
    }
    for (const r of replicas) {
      await waitFor(async () => (await call(r.url, 'GET', '/readyz')).status === 200, 15_000, `${r.url} ready again`, 100);
      assert.equal((await api(r, 'GET', '/jobs')).status, 200);
    }
  });

  it('the console works against any replica, with a token made through another', async () => {
    assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: run scripts/install-deps.sh (Debian package chromium)`);
    const user = await api(replicas[1]!, 'POST', '/users', { name: 'watcher', role: 'read-only' });
    assert.equal(user.status, 201, JSON.stringify(user.body));
    const made = await api(replicas[1]!, 'POST', '/tokens', { name: 'through r2', userId: user.body.id });
    assert.equal(made.status, 201, JSON.stringify(made.body));
    const token = made.body.token as string;
    const jobs = (await api(replicas[0]!, 'GET', '/jobs')).body as Array<{ id: number; state: string; owner: string; takeovers: number }>;
    assert.equal(jobs.length, 2);

    const browser = await chromium.launch({
      executablePath: CHROMIUM,
      headless: true,
      args: ['--no-sandbox', '--disable-background-networking'],
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
        // The job whose replica was killed: who finished it, and that it was taken over.
        const killed = jobs.find((j) => j.takeovers === 1)!;
        await page.goto(`${r.url}/jobs/${killed.id}`);
        await page.getByRole('heading', { name: `Job #${killed.id}` }).waitFor();
        assert.equal(await page.getByTestId('job-owner').innerText(), `${killed.owner} (taken over once)`);
        await page.context().close();
      }
    } finally {
      await browser.close();
    }
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
        const service = services[i]!;
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
