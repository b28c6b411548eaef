import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, test, type TestContext } from 'node:test';
import { request, type Agent } from 'undici';
import { silentLogger } from '../../src/common/log.js';
import { loadTls, type ClusterTls, type TlsFiles } from '../../src/common/tls.js';
import { ClusterToken } from '../../src/common/token.js';
import { jobSchema } from '../../src/manager/api/schemas.js';
import { HeldLease, JobLeases } from '../../src/manager/services/job-leases.js';
import { CREDENTIALS_NEED_TLS, PreheatRun } from '../../src/manager/services/preheat-run.js';
import { pieceSizeFor } from '../../src/storage/piece-plan.js';
import { buildImage, pushImage, type BuiltImage } from '../fixtures/images.js';
import { freePort, waitFor } from '../fixtures/processes.js';
import { startRegistry, type Registry } from '../fixtures/registry.js';
import { clusterAgent, testTlsFiles } from '../fixtures/tls.js';
import { ADMIN_TOKEN, backends, call, CLUSTER_TOKEN, peerBody, snapshot, startTestManager, type TestManager } from './helpers.js';
import { startStubPeer, type Behaviour, type StubPeer } from './stub-peer.js';

const CREDS = { user: 'puller', password: 'pull-secret' };

let registry: Registry;
let locked: Registry;
let image: BuiltImage;
/** What a preheat fetches: the layers, then the config. */
let blobs: Array<{ digest: string; size: number }>;
const stubs: StubPeer[] = [];

before(async () => {
  [registry, locked] = await Promise.all([startRegistry(), startRegistry({ htpasswd: CREDS })]);
  image = await buildImage({
    layers: [
      { sizeBytes: 200_000, seed: 'manager-jobs-1' },
      { sizeBytes: 5_000_000, seed: 'manager-jobs-2' },
    ],
  });
  await pushImage(image.layoutDir, image.tag, registry.host, 'app/web:1');
  await pushImage(image.layoutDir, image.tag, locked.host, 'private/web:1', { creds: CREDS });
  // A multi-platform index whose amd64 and arm64 entries both name the pushed manifest.
  const manifest = await request(`${registry.url}/v2/app/web/manifests/1`, {
    headers: { accept: 'application/vnd.oci.image.manifest.v1+json' },
  });
  const size = Number(manifest.headers['content-length']);
  const { config } = (await manifest.body.json()) as { config: { digest: string; size: number } };
  blobs = [...image.layers, config];
  const index = {
    schemaVersion: 2,
    mediaType: 'application/vnd.oci.image.index.v1+json',
    manifests: ['amd64', 'arm64'].map((architecture) => ({
      mediaType: 'application/vnd.oci.image.manifest.v1+json',
      digest: image.manifestDigest,
      size,
      platform: { os: 'linux', architecture },
    })),
  };
  const put = await request(`${registry.url}/v2/app/web/manifests/multi`, {
    method: 'PUT',
    headers: { 'content-type': 'application/vnd.oci.image.index.v1+json' },
    body: JSON.stringify(index),
  });
  assert.equal(put.statusCode, 201, await put.body.text());
});

const databases = backends();

after(async () => {
  await Promise.all(stubs.map((s) => s.close()));
  await Promise.all([registry?.stop(), locked?.stop()]);
  for (const backend of databases) await backend.stop();
});

type PeerSpec = { id: string; behaviour: Behaviour; seed?: boolean; zone?: string };

/** How stub peers reach a manager: the one running now (a test may restart it), over HTTPS when it serves TLS. */
interface StubCluster {
  manager(): TestManager;
  /** Host ids start with this. */
  prefix: string;
  tls?: ClusterTls;
  dispatcher?: Agent;
}

/**
 * Starts stub peers and keeps them registered as real peers do (a keep-alive every 100 ms,
 * a sixth of the liveness window here) until the test ends.
 */
async function startPeers(t: TestContext, cluster: StubCluster, specs: PeerSpec[]): Promise<StubPeer[]> {
  const started: StubPeer[] = [];
  for (const spec of specs) {
    const stub = await startStubPeer(`${cluster.prefix}-${spec.id}`, spec.behaviour, CLUSTER_TOKEN, { tls: cluster.tls });
    stubs.push(stub);
    started.push(stub);
    const keepalive = () =>
      call(cluster.manager().url, 'POST', '/api/v1/peers/keepalive', {
        token: CLUSTER_TOKEN,
        body: peerBody(stub.hostId, { uploadPort: stub.port, seed: spec.seed ?? false, labels: spec.zone ? { zone: spec.zone } : {} }),
        dispatcher: cluster.dispatcher,
      });
    const answer = await keepalive();
    assert.equal(answer.status, 200, JSON.stringify(answer.body));
    const timer = setInterval(() => void keepalive().catch(() => {}), 100);
    t.after(() => clearInterval(timer));
  }
  return started;
}

const MANAGER_TIMINGS = {
  keepalive: { intervalMs: 200, missedLimit: 3 },
  preheat: { pollMs: 50, timeoutMs: 2_000, concurrency: 4 },
};

for (const backend of databases) {
  describe(`preheat jobs on ${backend.name}`, () => {
    let m: TestManager;
    const admin = (method: string, pathname: string, body?: unknown) => call(m.url, method, pathname, { token: ADMIN_TOKEN, body });
    const peers = (t: TestContext, specs: PeerSpec[]) => startPeers(t, { manager: () => m, prefix: backend.name }, specs);

    before(async () => {
      m = await startTestManager(await backend.newDatabase(), MANAGER_TIMINGS);
    });
    after(async () => {
      await m?.stop();
    });

    async function finished(id: number) {
      await m.manager.jobs.settled(id);
      const job = await admin('GET', `/api/v1/jobs/${id}`);
      return jobSchema.parse(job.body);
    }

    test('preheat to the seeds: every layer on every seed, with the right requests, progress and audit', async (t) => {
      const [seedA, seedB, normal] = await peers(t, [
        { id: 'seed-a', behaviour: 'complete', seed: true },
        { id: 'seed-b', behaviour: 'complete', seed: true },
        { id: 'normal', behaviour: 'complete' },
      ]);
      assert.ok(seedA && seedB && normal, 'every stub peer started');
      const created = await admin('POST', '/api/v1/jobs', {
        type: 'preheat',
        image: `${registry.host}/app/web:1`,
        platform: 'linux/amd64',
        scope: 'seeds',
      });
      assert.equal(created.status, 201, JSON.stringify(created.body));
      const job = jobSchema.parse(created.body);
      assert.ok(['pending', 'running'].includes(job.state));
      assert.equal(job.progress.tasks, 2 * blobs.length);
      assert.deepEqual(job.args, {
        image: `${registry.host}/app/web:1`,
        platform: 'linux/amd64',
        scope: 'seeds',
        insecure: true,
        withCredentials: false,
      });

      const done = await finished(job.id);
      assert.equal(done.state, 'succeeded', done.error ?? '');
      assert.equal(done.error, null);
      assert.deepEqual(done.progress, {
        tasks: 6,
        pending: 0,
        running: 0,
        succeeded: 6,
        failed: 0,
        bytes: done.progress.totalBytes,
        totalBytes: 2 * blobs.reduce((s, l) => s + l.size, 0),
      });
      assert.deepEqual(
        done.layers.map((l) => [l.digest, l.size, l.peers, l.succeeded]),
        blobs.map((l) => [l.digest, l.size, 2, 2]),
      );
      assert.deepEqual(new Set(done.tasks?.map((t) => t.hostId)), new Set([seedA.hostId, seedB.hostId]));
      assert.equal(done.result?.manifestDigest, image.manifestDigest);
      assert.equal(normal.triggers.length, 0, 'a normal peer is not a seed');

      for (const seed of [seedA, seedB]) {
        assert.deepEqual(seed.triggers.map((t) => t.body.taskId).sort(), blobs.map((l) => l.digest).sort());
        for (const { authorization, body } of seed.triggers) {
          assert.equal(authorization, `Bearer ${CLUSTER_TOKEN}`);
          const layer = blobs.find((l) => l.digest === body.taskId);
          assert.ok(layer, `the trigger names a layer of the image: ${body.taskId}`);
          assert.equal(body.contentLength, layer.size);
          assert.equal(body.pieceSize, pieceSizeFor(layer.size));
          assert.equal(body.origin.url, `${registry.url}/v2/app/web/blobs/${layer.digest}`);
          assert.deepEqual(body.origin.headers, {}, 'a public repository needs no header');
          // The origin the peer is sent to really serves the layer.
          const blob = await request(body.origin.url, { headers: body.origin.headers });
          const hash = createHash('sha256')
            .update(Buffer.from(await blob.body.arrayBuffer()))
            .digest('hex');
          assert.equal(`sha256:${hash}`, layer.digest);
        }
        assert.ok(seed.statusPolls >= 2 * 3, 'progress was followed until complete');
      }
      const audit = (await admin('GET', '/api/v1/audit?limit=50')).body as Array<{ action: string; target: string; actor: string }>;
      const forJob = audit.filter((a) => a.target === `job:${job.id}`);
      assert.deepEqual(forJob.map((a) => [a.action, a.actor]).reverse(), [
        ['job.create', 'user:admin'],
        ['job.succeed', 'system'],
      ]);
    });

    test('an index resolves to the platform asked for; all-peers and zone scopes pick their peers', async (t) => {
      await sleep(800); // the earlier tests' peers stopped calling: they fall out of the 600 ms liveness window
      const [a, b] = await peers(t, [
        { id: 'all-a', behaviour: 'complete', seed: true, zone: 'north' },
        { id: 'all-b', behaviour: 'forget-once', zone: 'south' },
      ]);
      assert.ok(a && b, 'every stub peer started');
      const all = await admin('POST', '/api/v1/jobs', {
        type: 'preheat',
        image: `${registry.host}/app/web:multi`,
        platform: 'linux/arm64',
        scope: 'all-peers',
      });
      assert.equal(all.status, 201, JSON.stringify(all.body));
      const done = await finished(all.body.id);
      assert.equal(done.state, 'succeeded', done.error ?? '');
      assert.equal(done.result?.manifestDigest, image.manifestDigest);
      assert.ok(b.triggers.length > blobs.length, 'a peer that lost a fetch is asked again');
      assert.equal(a.triggers.length, blobs.length);

      const zone = await admin('POST', '/api/v1/jobs', {
        type: 'preheat',
        image: `${registry.host}/app/web:multi`,
        platform: 'linux/amd64',
        scope: 'zone:north',
      });
      assert.equal(zone.status, 201, JSON.stringify(zone.body));
      const zoned = await finished(zone.body.id);
      assert.deepEqual([...new Set(zoned.tasks?.map((t) => t.hostId))], [a.hostId]);
    });

    test('a peer that fails or refuses: the others finish, the job fails saying which peer, which layer and why', async (t) => {
      const [good, failing, refusing] = await peers(t, [
        { id: 'mixed-good', behaviour: 'complete', zone: 'mixed' },
        { id: 'mixed-fail', behaviour: 'fail', zone: 'mixed' },
        { id: 'mixed-refuse', behaviour: 'refuse', zone: 'mixed' },
      ]);
      assert.ok(good && failing && refusing, 'every stub peer started');
      const created = await admin('POST', '/api/v1/jobs', {
        type: 'preheat',
        image: `${registry.host}/app/web:1`,
        platform: 'linux/amd64',
        scope: 'zone:mixed',
      });
      assert.equal(created.status, 201, JSON.stringify(created.body));
      const done = await finished(created.body.id);
      assert.equal(done.state, 'failed');
      const { error, tasks } = done;
      assert.ok(error && tasks, 'a failed job says why and lists its tasks');
      assert.match(error, /^6 of 9 blob fetches failed/);
      assert.match(error, new RegExp(`peer ${failing.hostId} .*the peer's fetch failed: origin answered HTTP 500`));
      assert.match(error, new RegExp(`peer ${refusing.hostId} .*refused the preheat: HTTP 400: disk quota would be exceeded`));
      const byHost = (hostId: string) => tasks.filter((t) => t.hostId === hostId);
      assert.ok(byHost(good.hostId).every((t) => t.state === 'succeeded' && t.bytes === t.size));
      assert.ok(byHost(failing.hostId).every((t) => t.state === 'failed' && /origin answered HTTP 500/.test(t.error ?? '')));
      assert.ok(byHost(refusing.hostId).every((t) => t.state === 'failed' && /disk quota/.test(t.error ?? '')));
      const audit = (await admin('GET', '/api/v1/audit?limit=5')).body as Array<{
        action: string;
        target: string;
        detail: { reason?: string };
      }>;
      const fail = audit.find((a) => a.target === `job:${done.id}` && a.action === 'job.fail');
      assert.ok(fail, 'the failure is audited');
      assert.equal(fail.detail.reason, done.error);
    });

    test('a peer that never finishes: the job times out with the bytes it got', async (t) => {
      const [stalled] = await peers(t, [{ id: 'stall', behaviour: 'stall', zone: 'slow' }]);
      assert.ok(stalled, 'every stub peer started');
      const started = Date.now();
      const created = await admin('POST', '/api/v1/jobs', {
        type: 'preheat',
        image: `${registry.host}/app/web:1`,
        platform: 'linux/amd64',
        scope: 'zone:slow',
      });
      assert.equal(created.status, 201, JSON.stringify(created.body));
      // While running, progress is visible.
      await waitFor(async () => (await admin('GET', `/api/v1/jobs/${created.body.id}`)).body.progress.bytes > 0, 1_500, 'partial progress');
      const done = await finished(created.body.id);
      assert.ok(Date.now() - started >= 2_000, 'not before the timeout');
      assert.equal(done.state, 'failed');
      assert.match(done.error ?? '', /timed out after \d+ s with \d+ of \d+ bytes/);
      assert.ok(done.tasks, 'the job lists its tasks');
      for (const t of done.tasks) {
        assert.equal(t.state, 'failed');
        assert.equal(t.bytes, Math.floor(t.size / 2));
        assert.equal(t.hostId, stalled.hostId);
      }
    });

    test('bad preheats are refused at POST with a 4xx naming the problem, and record nothing', async (t) => {
      await peers(t, [{ id: 'bad-target', behaviour: 'complete', seed: true, zone: 'bad' }]);
      // Peers keep calling meanwhile: what must not change is everything about jobs.
      const jobState = async () => {
        const all = await snapshot(m.manager);
        return { jobs: all.jobs, job_tasks: all.job_tasks, audit: all.audit_log?.filter((a: any) => a.action.startsWith('job.')) };
      };
      const before = await jobState();
      const closedPort = await freePort();
      const cases: Array<[unknown, number, string, RegExp]> = [
        [
          { image: `${registry.host}/app/nothing:1` },
          422,
          'image_not_found',
          new RegExp(`image: ${registry.host}/app/nothing:1 was not found`),
        ],
        [{ image: `${registry.host}/app/web:nope` }, 422, 'image_not_found', /image: .*app\/web:nope was not found/],
        [
          { image: `${registry.host}/app/web:1`, platform: 'linux/arm64' },
          422,
          'platform_not_found',
          /platform: .* is linux\/amd64, not linux\/arm64/,
        ],
        [
          { image: `${registry.host}/app/web:multi`, platform: 'linux/s390x' },
          422,
          'platform_not_found',
          /has no linux\/s390x manifest \(it has: linux\/amd64, linux\/arm64\)/,
        ],
        [{ image: `${registry.host}/app/web:1`, platform: 'amd64' }, 400, 'invalid_request', /platform: "amd64" must be os\/architecture/],
        [{ image: 'UPPER/case' }, 400, 'invalid_request', /^image: /],
        [{ image: `${locked.host}/private/web:1` }, 422, 'registry_auth_refused', /credentials: .*requires credentials/],
        [{ image: `127.0.0.1:${closedPort}/app/web:1` }, 502, 'registry_unreachable', /cannot reach the registry/],
        [
          { image: `${registry.host}/app/web:1`, scope: 'zone:nowhere' },
          422,
          'no_target_peers',
          /scope: no active peer is in scope "zone:nowhere"/,
        ],
        [{ image: `${registry.host}/app/web:1`, credentials: { username: 'u' } }, 400, 'invalid_request', /body\.credentials\.password/],
        [{ image: `${registry.host}/app/web:1`, insecure: 'yes' }, 400, 'invalid_request', /body\.insecure/],
      ];
      for (const [body, status, code, message] of cases) {
        const answer = await admin('POST', '/api/v1/jobs', {
          type: 'preheat',
          platform: 'linux/amd64',
          scope: 'zone:bad',
          ...(body as object),
        });
        assert.equal(answer.status, status, `${JSON.stringify(body)} → ${JSON.stringify(answer.body)}`);
        assert.equal(answer.body.error.code, code, JSON.stringify(answer.body));
        assert.match(answer.body.error.message, message);
      }
      assert.deepEqual(await jobState(), before);
    });

    test('registry credentials on a manager without TLS: refused at POST with a 400 naming why; no peer is asked, nothing is recorded', async (t) => {
      const [seed] = await peers(t, [{ id: 'plain-private', behaviour: 'complete', seed: true, zone: 'plain-private' }]);
      assert.ok(seed, 'every stub peer started');
      const jobsBefore = (await snapshot(m.manager)).jobs;
      const answer = await admin('POST', '/api/v1/jobs', {
        type: 'preheat',
        image: `${locked.host}/private/web:1`,
        platform: 'linux/amd64',
        scope: 'zone:plain-private',
        credentials: { username: CREDS.user, password: CREDS.password },
      });
      assert.equal(answer.status, 400, JSON.stringify(answer.body));
      assert.equal(answer.body.error.code, 'tls_required');
      assert.equal(answer.body.error.message, `credentials: ${CREDENTIALS_NEED_TLS}`);
      assert.match(answer.body.error.message, /over plain HTTP: run the manager with TLS/);
      await sleep(300); // a few of the stub's keep-alives: time for a request that should not come
      assert.equal(seed.requests.length, 0, 'the peer was asked nothing');
      assert.deepEqual((await snapshot(m.manager)).jobs, jobsBefore);
    });

    test('a preheat run never sends registry credentials to a peer over plain HTTP: the fetch fails naming why', async (t) => {
      // The engine refuses such a job before it runs (above); the run holds the same line by itself.
      const [peer] = await peers(t, [{ id: 'plain-run', behaviour: 'complete', zone: 'plain-run' }]);
      const store = m.manager.store;
      const leases = new JobLeases(store.db, store.dialect, 'direct-run', 60_000);
      const now = Date.now();
      const job = await store.db
        .insertInto('jobs')
        .values({
          type: 'preheat',
          state: 'pending',
          args: '{}',
          result: null,
          error: null,
          created_by: 'user:admin',
          created_at: now,
          updated_at: now,
          ...leases.ownedFromNow(),
        })
        .returningAll()
        .executeTakeFirstOrThrow();
      const [layer] = blobs;
      assert.ok(peer && layer, 'a stub peer and a layer');
      const row = await store.db
        .insertInto('job_tasks')
        .values({
          job_id: job.id,
          digest: layer.digest,
          size: layer.size,
          host_id: peer.hostId,
          peer_address: `127.0.0.1:${peer.port}`,
          state: 'pending',
          bytes: 0,
          error: null,
          updated_at: now,
        })
        .returningAll()
        .executeTakeFirstOrThrow();
      const lease = new HeldLease(60_000);
      lease.renewed(performance.now());
      t.after(() => lease.end('the test ended'));
      const origin = {
        blobUrl: (digest: string) => `${locked.url}/v2/private/web/blobs/${digest}`,
        originHeaders: { authorization: `Basic ${Buffer.from(`${CREDS.user}:${CREDS.password}`).toString('base64')}` },
      };
      const run = new PreheatRun(
        { id: job.id, createdAt: now, state: 'pending' },
        [row],
        { resolved: {}, origin },
        leases,
        lease,
        { pollMs: 50, timeoutMs: 5_000, concurrency: 1, clusterToken: ClusterToken.of(CLUSTER_TOKEN) },
        silentLogger,
      );
      assert.equal(await run.run(true), 'failed');
      const fetch = await store.db.selectFrom('job_tasks').selectAll().where('id', '=', row.id).executeTakeFirstOrThrow();
      assert.equal(fetch.state, 'failed');
      assert.equal(fetch.error, CREDENTIALS_NEED_TLS);
      assert.equal(peer.requests.length, 0, 'the peer was sent nothing');
    });

    test('a restart keeps jobs, clusters and tokens; the restarted manager takes over the jobs the stop cut off and finishes them', async (t) => {
      const token = (await admin('POST', '/api/v1/tokens', { name: 'keep' })).body.token as string;
      await admin('POST', '/api/v1/clusters', { name: 'kept', scopes: { zones: ['kept'] } });
      // Stalled at half until the test lets it go on: the job is still running when the manager stops.
      const [slow] = await peers(t, [
        { id: 'restart-slow', behaviour: 'stall', zone: 'restart' },
        { id: 'restart-quick', behaviour: 'complete', zone: 'restart-quick' },
      ]);
      assert.ok(slow, 'every stub peer started');
      const quick = await admin('POST', '/api/v1/jobs', {
        type: 'preheat',
        image: `${registry.host}/app/web:1`,
        platform: 'linux/amd64',
        scope: 'zone:restart-quick',
      });
      assert.equal((await finished(quick.body.id)).state, 'succeeded');
      // A job that a crashed manager without leases (an older version) left "running".
      await m.manager.store.db
        .updateTable('jobs')
        .set({ state: 'running', error: null, owner: null, lease_expires_at: 0 })
        .where('id', '=', quick.body.id)
        .execute();
      const cut = await admin('POST', '/api/v1/jobs', {
        type: 'preheat',
        image: `${registry.host}/app/web:1`,
        platform: 'linux/amd64',
        scope: 'zone:restart',
      });
      assert.equal(cut.status, 201);
      assert.equal(cut.body.owner, m.manager.replica);
      await waitFor(async () => (await admin('GET', `/api/v1/jobs/${cut.body.id}`)).body.progress.bytes > 0, 5_000, 'the job under way');
      const others = (jobs: Array<{ id: number }>) => jobs.filter((j) => j.id !== cut.body.id && j.id !== quick.body.id);
      const jobsBefore = others((await admin('GET', '/api/v1/jobs?limit=1000')).body);
      const clustersBefore = (await admin('GET', '/api/v1/clusters')).body;
      const before = m.manager.replica;

      m = await m.restart();
      assert.notEqual(m.manager.replica, before, 'a restarted manager is a new replica');
      await waitFor(() => slow.requests.some((r) => r.replica === m.manager.replica), 5_000, 'the new owner asking the peer');
      slow.unstall();
      const resumed = await finished(cut.body.id);
      assert.equal(resumed.state, 'succeeded', resumed.error ?? '');
      assert.equal(resumed.error, null);
      assert.equal(resumed.owner, m.manager.replica);
      assert.equal(resumed.takeovers, 1);
      assert.equal(resumed.progress.succeeded, blobs.length);
      assert.equal(
        slow.triggers.length,
        blobs.length,
        'the new owner asked the peer how its fetches went instead of asking it to fetch again',
      );
      const audit = (
        (await admin('GET', '/api/v1/audit?limit=100')).body as Array<{ action: string; target: string; detail: Record<string, unknown> }>
      ).filter((a) => a.target === `job:${cut.body.id}`);
      assert.deepEqual(audit.map((a) => a.action).reverse(), ['job.create', 'job.takeover', 'job.succeed']);
      assert.deepEqual([audit[1]?.detail.from, audit[1]?.detail.to], [before, m.manager.replica]);

      // Taken over by whichever manager looked first (the one stopping may have), and finished.
      const crashed = await finished(quick.body.id);
      assert.equal(crashed.state, 'succeeded', 'its fetches had all ended well');
      assert.equal(crashed.error, null);
      assert.ok(crashed.takeovers >= 1);
      assert.ok([before, m.manager.replica].includes(crashed.owner ?? ''), crashed.owner ?? 'no owner');
      assert.deepEqual(others((await admin('GET', '/api/v1/jobs?limit=1000')).body), jobsBefore);
      assert.deepEqual((await admin('GET', '/api/v1/clusters')).body, clustersBefore);
      assert.equal((await call(m.url, 'GET', '/api/v1/me', { token })).status, 200);
    });
  });

  describe(`preheat jobs with registry credentials, over TLS, on ${backend.name}`, () => {
    let m: TestManager;
    let files: TlsFiles;
    let tls: ClusterTls;
    let agent: Agent;
    const admin = (method: string, pathname: string, body?: unknown) =>
      call(m.url, method, pathname, { token: ADMIN_TOKEN, body, dispatcher: agent });
    const peers = (t: TestContext, specs: PeerSpec[]) =>
      startPeers(t, { manager: () => m, prefix: `${backend.name}-tls`, tls, dispatcher: agent }, specs);

    before(async () => {
      files = await testTlsFiles();
      const loaded = loadTls(files);
      assert.ok(loaded, 'the test TLS files load');
      tls = loaded;
      agent = await clusterAgent();
      m = await startTestManager(await backend.newDatabase(), { ...MANAGER_TIMINGS, tls: files });
      assert.match(m.url, /^https:/);
    });
    after(async () => {
      await m?.stop();
      await agent?.close();
    });

    async function finished(id: number) {
      await m.manager.jobs.settled(id);
      const job = await admin('GET', `/api/v1/jobs/${id}`);
      return jobSchema.parse(job.body);
    }

    test('credentials the registry refuses are refused at POST with a 422 naming the problem', async (t) => {
      await peers(t, [{ id: 'wrong', behaviour: 'complete', zone: 'wrong' }]);
      const answer = await admin('POST', '/api/v1/jobs', {
        type: 'preheat',
        image: `${locked.host}/private/web:1`,
        platform: 'linux/amd64',
        scope: 'zone:wrong',
        credentials: { username: CREDS.user, password: 'wrong' },
      });
      assert.equal(answer.status, 422, JSON.stringify(answer.body));
      assert.equal(answer.body.error.code, 'registry_auth_refused');
      assert.match(answer.body.error.message, /credentials: .*refused the credentials/);
    });

    test('registry credentials: peers are sent, over TLS, a header that opens the private layers; credentials are not stored', async (t) => {
      const [seed] = await peers(t, [{ id: 'private', behaviour: 'complete', seed: true, zone: 'private' }]);
      assert.ok(seed, 'every stub peer started');
      const created = await admin('POST', '/api/v1/jobs', {
        type: 'preheat',
        image: `${locked.host}/private/web:1`,
        platform: 'linux/amd64',
        scope: 'zone:private',
        credentials: { username: CREDS.user, password: CREDS.password },
      });
      assert.equal(created.status, 201, JSON.stringify(created.body));
      const done = await finished(created.body.id);
      assert.equal(done.state, 'succeeded', done.error ?? '');
      assert.equal(seed.triggers.length, blobs.length);
      for (const { body, encrypted } of seed.triggers) {
        assert.ok(encrypted, 'the credentials crossed over TLS');
        assert.match(body.origin.headers.authorization ?? '', /^Basic /);
        const blob = await request(body.origin.url, { method: 'HEAD', headers: body.origin.headers });
        assert.equal(blob.statusCode, 200);
        const anonymous = await request(body.origin.url, { method: 'HEAD' });
        assert.equal(anonymous.statusCode, 401);
      }
      const dump = JSON.stringify(await snapshot(m.manager));
      assert.ok(!dump.includes(CREDS.password), 'the password is stored nowhere');
    });

    test('a job with registry credentials cut off by a restart: fetches under way finish; one the peer lost fails, saying the credentials went with the stopped manager', async (t) => {
      const [going, losing] = await peers(t, [
        { id: 'creds-going', behaviour: 'stall', zone: 'creds' },
        { id: 'creds-losing', behaviour: 'stall', zone: 'creds' },
      ]);
      assert.ok(going && losing, 'every stub peer started');
      const created = await admin('POST', '/api/v1/jobs', {
        type: 'preheat',
        image: `${locked.host}/private/web:1`,
        platform: 'linux/amd64',
        scope: 'zone:creds',
        credentials: { username: CREDS.user, password: CREDS.password },
      });
      assert.equal(created.status, 201, JSON.stringify(created.body));
      await waitFor(
        async () => (await admin('GET', `/api/v1/jobs/${created.body.id}`)).body.progress.bytes > 0,
        5_000,
        'the job under way',
      );
      const before = m.manager.replica;
      losing.forget(); // as a restarted peer does: the new owner's first question gets a 404
      going.unstall();
      m = await m.restart();
      const done = await finished(created.body.id);
      assert.equal(done.state, 'failed');
      assert.equal(done.takeovers, 1);
      const { tasks } = done;
      assert.ok(tasks, 'the job lists its tasks');
      const byHost = (stub: StubPeer) => tasks.filter((task) => task.hostId === stub.hostId);
      assert.ok(
        byHost(going).every((task) => task.state === 'succeeded'),
        JSON.stringify(byHost(going)),
      );
      for (const task of byHost(losing)) {
        assert.equal(task.state, 'failed');
        assert.equal(
          task.error,
          `the job's registry credentials were only in the memory of replica ${before}, which stopped holding the job (credentials are never stored), so no other replica can send a peer to the registry`,
        );
      }
      assert.match(
        done.error ?? '',
        new RegExp(
          `^${blobs.length} of ${2 * blobs.length} blob fetches failed: peer ${losing.hostId} .*credentials were only in the memory of replica`,
        ),
      );
      assert.equal(losing.triggers.length, blobs.length, 'the lost fetches were not asked for without credentials');
    });
  });
}
