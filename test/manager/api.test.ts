import assert from 'node:assert/strict';
import fsp from 'node:fs/promises';
import http from 'node:http';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, test } from 'node:test';
import { z } from 'zod';
import { clusterSchema, jobSchema, overviewSchema, peerSchema, schedulerSchema } from '../../src/manager/api/schemas.js';
import { openStore } from '../../src/manager/db/connect.js';
import { migrateToLatest } from '../../src/manager/migrations/index.js';
import { hashToken } from '../../src/manager/services/auth.js';
import { markSilentInactive } from '../../src/manager/services/members.js';
import { defaultScheduling } from '../../src/scheduler/config.js';
import { waitFor } from '../fixtures/processes.js';
import { ADMIN_TOKEN, backends, call, CLUSTER_TOKEN, peerBody, snapshot, startTestManager, type TestManager } from './helpers.js';

const digest = (n: number) => `sha256:${n.toString(16).padStart(64, '0')}`;

for (const backend of backends()) {
  describe(`manager API on ${backend.name}`, () => {
    let m: TestManager;
    const admin = (method: string, pathname: string, body?: unknown) => call(m.url, method, pathname, { token: ADMIN_TOKEN, body });
    const cluster = (method: string, pathname: string, body?: unknown) => call(m.url, method, pathname, { token: CLUSTER_TOKEN, body });

    before(async () => {
      m = await startTestManager(await backend.newDatabase(), { keepalive: { intervalMs: 250, missedLimit: 3 } });
    });
    after(async () => {
      await m?.stop();
      await backend.stop();
    });

    test('migrations run from an empty database, once', async () => {
      const store = await openStore(await backend.newDatabase());
      try {
        const applied = await store.db
          .selectFrom('starling_migrations' as any)
          .select('name' as any)
          .execute();
        assert.deepEqual(
          applied.map((r: any) => r.name),
          ['001-initial', '002-job-leases'],
        );
        assert.deepEqual(store.migrationsApplied, ['001-initial', '002-job-leases']);
        const clusters = await store.db.selectFrom('scheduler_clusters').selectAll().execute();
        assert.equal(clusters.length, 1);
        const [cluster] = clusters;
        assert.ok(cluster, 'the default cluster is created');
        assert.equal(cluster.name, 'default');
        assert.equal(cluster.is_default, 1);
        assert.deepEqual(JSON.parse(cluster.config), defaultScheduling());
        assert.deepEqual(await migrateToLatest(store.db, store.dialect), []);
      } finally {
        await store.close();
      }
    });

    test('readiness: 200 on a current schema; 503 naming the missing migration when the database is behind; liveness does not ask the database', async () => {
      assert.deepEqual(await call(m.url, 'GET', '/readyz'), { status: 200, body: { ready: true, replica: m.manager.replica } });
      // As after restoring a backup taken before the last migration.
      const db = m.manager.store.db;
      await db
        .deleteFrom('starling_migrations' as any)
        .where('name' as any, '=', '002-job-leases')
        .execute();
      try {
        const behind = await call(m.url, 'GET', '/readyz');
        assert.equal(behind.status, 503);
        assert.deepEqual(behind.body, {
          ready: false,
          replica: m.manager.replica,
          reason: 'the database schema is behind this manager: it lacks 002-job-leases',
        });
      } finally {
        await db
          .insertInto('starling_migrations' as any)
          .values({ name: '002-job-leases', timestamp: new Date().toISOString() } as any)
          .execute();
      }
      assert.equal((await call(m.url, 'GET', '/readyz')).status, 200);
      assert.deepEqual(await call(m.url, 'GET', '/healthz'), { status: 200, body: { ok: true } });
    });

    test('health, metrics, and an OpenAPI document that describes every route served', async () => {
      assert.deepEqual((await call(m.url, 'GET', '/healthz')).body, { ok: true });
      const metrics = await call<string>(m.url, 'GET', '/metrics');
      assert.equal(metrics.status, 200);
      assert.match(metrics.body, /^starling_manager_peers\{state="active"\} \d+$/m);
      assert.match(metrics.body, /^starling_manager_peer_reported_bytes\{source="origin"\} \d+$/m);

      const doc = (await call(m.url, 'GET', '/api/v1/openapi.json')).body;
      assert.equal(doc.openapi, '3.1.0');
      const required = [
        'get /api/v1/clusters',
        'post /api/v1/clusters',
        'get /api/v1/clusters/{id}',
        'patch /api/v1/clusters/{id}',
        'patch /api/v1/clusters/{id}/config',
        'delete /api/v1/clusters/{id}',
        'get /api/v1/schedulers',
        'post /api/v1/schedulers/keepalive',
        'get /api/v1/peers',
        'post /api/v1/peers/keepalive',
        'get /api/v1/tasks',
        'get /api/v1/tokens',
        'post /api/v1/tokens',
        'delete /api/v1/tokens/{id}',
        'get /api/v1/users',
        'post /api/v1/users',
        'get /api/v1/me',
        'post /api/v1/jobs',
        'get /api/v1/jobs',
        'get /api/v1/jobs/{id}',
        'get /api/v1/audit',
        'get /api/v1/overview',
        'get /metrics',
        'get /healthz',
        'get /readyz',
        'get /api/v1/openapi.json',
      ];
      const documented = Object.entries(doc.paths as Record<string, Record<string, any>>).flatMap(([p, ops]) =>
        Object.keys(ops).map((method) => `${method} ${p}`),
      );
      assert.deepEqual([...documented].sort(), [...required].sort());
      for (const [p, ops] of Object.entries(doc.paths as Record<string, Record<string, any>>)) {
        for (const [method, op] of Object.entries(ops)) {
          // Served exactly as documented.
          assert.ok(
            m.manager.app.hasRoute({ method: method.toUpperCase(), url: p.replace(/\{(\w+)\}/g, ':$1') }),
            `${method} ${p} is served`,
          );
          assert.ok(op.summary && op.responses, `${method} ${p} has a summary and responses`);
          if (['post', 'patch'].includes(method))
            assert.ok(op.requestBody?.content['application/json'].schema, `${method} ${p} documents its body`);
        }
      }
      const operationIds = Object.values(doc.paths as Record<string, Record<string, { operationId: string }>>).flatMap((ops) =>
        Object.values(ops).map((op) => op.operationId),
      );
      assert.equal(new Set(operationIds).size, operationIds.length, 'operation ids are unique');
      assert.equal(doc.paths['/api/v1/clusters'].post.requestBody.content['application/json'].schema.additionalProperties, false);
      assert.deepEqual(doc.paths['/api/v1/jobs'].post.security, [{ userToken: [] }]);
      assert.ok(
        doc.paths['/api/v1/clusters/{id}/config'].patch.requestBody.content['application/json'].schema.properties.candidateParentLimit,
      );
    });

    test('clusters: create, read, rename, scopes, default, config patch (validated, versioned), delete — each audited', async () => {
      const created = await admin('POST', '/api/v1/clusters', {
        name: 'east',
        scopes: { zones: ['east'] },
        config: { candidateParentLimit: 8 },
      });
      assert.equal(created.status, 201, JSON.stringify(created.body));
      const c = clusterSchema.parse(created.body);
      assert.equal(c.config.candidateParentLimit, 8);
      assert.equal(c.config.backToSourceLimit, defaultScheduling().backToSourceLimit);
      assert.deepEqual(c.scopes, { zones: ['east'], cidrs: [], hostnames: [] });

      assert.equal((await admin('GET', `/api/v1/clusters/${c.id}`)).body.name, 'east');
      assert.equal((await admin('POST', '/api/v1/clusters', { name: 'east' })).status, 409);

      const patched = await admin('PATCH', `/api/v1/clusters/${c.id}`, { name: 'east-1', scopes: { cidrs: ['127.5.0.0/16'] } });
      assert.equal(patched.status, 200, JSON.stringify(patched.body));
      assert.deepEqual(patched.body.scopes, { zones: ['east'], cidrs: ['127.5.0.0/16'], hostnames: [] });

      const config = await admin('PATCH', `/api/v1/clusters/${c.id}/config`, { backToSourceLimit: 3, weights: { pieces: 50 } });
      assert.equal(config.status, 200, JSON.stringify(config.body));
      assert.equal(config.body.config.backToSourceLimit, 3);
      assert.equal(config.body.config.candidateParentLimit, 8, 'other settings stay');
      assert.deepEqual(config.body.config.weights, { ...defaultScheduling().weights, pieces: 50 }, 'nested settings merge');
      assert.ok(config.body.configVersion > c.configVersion);

      const badConfig = await admin('PATCH', `/api/v1/clusters/${c.id}/config`, { candidateParentLimit: 500, turbo: true });
      assert.equal(badConfig.status, 400);
      assert.match(badConfig.body.error.message, /config\.candidateParentLimit/);
      assert.match(badConfig.body.error.message, /config\.turbo: unknown field/);
      assert.equal((await admin('GET', `/api/v1/clusters/${c.id}`)).body.config.candidateParentLimit, 8, 'a refused patch changes nothing');

      const made = await admin('PATCH', `/api/v1/clusters/${c.id}`, { isDefault: true });
      assert.equal(made.body.isDefault, true);
      const all = (await admin('GET', '/api/v1/clusters')).body as Array<{ id: number; isDefault: boolean; name: string }>;
      assert.deepEqual(
        all.filter((x) => x.isDefault).map((x) => x.id),
        [c.id],
        'exactly one default',
      );
      assert.equal((await admin('DELETE', `/api/v1/clusters/${c.id}`)).status, 409, 'the default cannot be deleted');
      const original = all.find((x) => x.name === 'default');
      assert.ok(original, 'the default cluster is listed');
      await admin('PATCH', `/api/v1/clusters/${original.id}`, { isDefault: true });
      assert.equal((await admin('DELETE', `/api/v1/clusters/${c.id}`)).status, 204);
      assert.equal((await admin('GET', `/api/v1/clusters/${c.id}`)).status, 404);

      const audit = (await admin('GET', `/api/v1/audit?limit=1000`)).body as Array<{ action: string; target: string; actor: string }>;
      const mine = audit
        .filter((a) => a.target === `cluster:${c.id}`)
        .map((a) => a.action)
        .reverse();
      assert.deepEqual(mine, ['cluster.create', 'cluster.update', 'cluster.config', 'cluster.update', 'cluster.delete']);
      assert.ok(audit.filter((a) => a.target === `cluster:${c.id}`).every((a) => a.actor === 'user:admin'));
    });

    test('bad input: 400 naming the field (unknown fields, wrong types, bad JSON, bad CIDR, bad id); unknown things 404', async () => {
      const cases: Array<[string, string, unknown, RegExp]> = [
        ['POST', '/api/v1/clusters', { name: 'x1', colour: 'red' }, /body\.colour: unknown field/],
        ['POST', '/api/v1/clusters', { name: 42 }, /body\.name: .*expected string/],
        [
          'POST',
          '/api/v1/clusters',
          { name: 'x2', scopes: { cidrs: ['127.0.0.0/8', '300.1.1.1/8'] } },
          /body\.scopes\.cidrs\.1: must be a CIDR/,
        ],
        [
          'POST',
          '/api/v1/clusters',
          { name: 'x3', config: { candidateParentLimit: 'many' } },
          /body\.config\.candidateParentLimit: .*expected number/,
        ],
        ['POST', '/api/v1/users', { name: 'bob', role: 'root' }, /body\.role/],
        ['POST', '/api/v1/tokens', { name: 't', expiresInDays: -1 }, /body\.expiresInDays/],
        [
          'POST',
          '/api/v1/jobs',
          { type: 'preheat', image: 'a/b:c', scope: 'everyone' },
          /body\.scope: must be "seeds", "all-peers" or "zone:<zone>"/,
        ],
        ['POST', '/api/v1/jobs', { type: 'warmup', image: 'a/b:c' }, /body\.type/],
        ['POST', '/api/v1/jobs', { type: 'preheat', image: 'a/b:c', registry: 'x' }, /body\.registry: unknown field/],
        ['GET', '/api/v1/clusters/abc', undefined, /path\.id/],
        ['GET', '/api/v1/peers?colour=red', undefined, /query\.colour: unknown field/],
        ['GET', '/api/v1/audit?limit=0', undefined, /query\.limit/],
        ['GET', '/api/v1/overview?verbose=1', undefined, /query\.verbose: unknown field/],
      ];
      for (const [method, pathname, body, message] of cases) {
        const answer = await admin(method, pathname, body);
        assert.equal(answer.status, 400, `${method} ${pathname} ${JSON.stringify(body)} → ${JSON.stringify(answer.body)}`);
        assert.equal(answer.body.error.code, 'invalid_request');
        assert.match(answer.body.error.message, message);
      }
      const badJson = await call(m.url, 'POST', '/api/v1/clusters', { token: ADMIN_TOKEN, raw: '{"name": ' });
      assert.equal(badJson.status, 400);
      assert.match(badJson.body.error.message, /body: not valid JSON/);
      const noBody = await call(m.url, 'POST', '/api/v1/users', { token: ADMIN_TOKEN });
      assert.equal(noBody.status, 400);
      assert.match(noBody.body.error.message, /body/);
      const text = await call(m.url, 'POST', '/api/v1/users', {
        token: ADMIN_TOKEN,
        raw: 'name=bob',
        headers: { 'content-type': 'text/plain' },
      });
      assert.equal(text.status, 400);
      assert.match(text.body.error.message, /body: .*expected object/);
      const form = await call(m.url, 'POST', '/api/v1/users', {
        token: ADMIN_TOKEN,
        raw: 'name=bob',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
      });
      assert.equal(form.status, 415);
      assert.equal(form.body.error.code, 'unsupported_media_type');
      assert.equal((await admin('GET', '/api/v1/clusters/9999')).body.error.code, 'not_found');
      assert.equal((await admin('GET', '/api/v1/nothing')).status, 404);
      assert.deepEqual(Object.keys((await admin('GET', '/api/v1/nothing')).body), ['error']);
    });

    test('tokens: shown once, stored as sha256 only, listed without values, revocable; users with roles', async () => {
      const user = await admin('POST', '/api/v1/users', { name: 'carol', role: 'admin' });
      assert.equal(user.status, 201);
      assert.equal((await admin('POST', '/api/v1/users', { name: 'carol', role: 'read-only' })).status, 409);
      const created = await admin('POST', '/api/v1/tokens', { name: 'ci', userId: user.body.id, expiresInDays: 30 });
      assert.equal(created.status, 201, JSON.stringify(created.body));
      const token = created.body.token as string;
      assert.match(token, /^stl_[A-Za-z0-9_-]{43}$/);
      const row = await m.manager.store.db.selectFrom('tokens').selectAll().where('id', '=', created.body.id).executeTakeFirstOrThrow();
      assert.equal(row.hash, hashToken(token));
      const dump = JSON.stringify(await snapshot(m.manager));
      assert.ok(!dump.includes(token), 'the token itself is stored nowhere');
      const listed = (await admin('GET', '/api/v1/tokens')).body as Array<Record<string, unknown>>;
      assert.ok(listed.some((t) => t.id === created.body.id && t.userName === 'carol'));
      assert.ok(listed.every((t) => !('token' in t) && !('hash' in t)));
      assert.equal((await call(m.url, 'GET', '/api/v1/me', { token })).body.user.name, 'carol');
      assert.equal((await admin('DELETE', `/api/v1/tokens/${created.body.id}`)).status, 204);
      assert.equal((await call(m.url, 'GET', '/api/v1/me', { token })).status, 401, 'a revoked token no longer works');
      assert.equal((await admin('DELETE', `/api/v1/tokens/${created.body.id}`)).status, 404);
      const audit = (await admin('GET', '/api/v1/audit?limit=20')).body as Array<{ action: string }>;
      assert.deepEqual(
        audit.slice(0, 3).map((a) => a.action),
        ['token.revoke', 'token.create', 'user.create'],
      );
    });

    test('no valid token: every change is refused with 401 and the database is unchanged', async () => {
      const reader = await admin('POST', '/api/v1/users', { name: 'expiring', role: 'admin' });
      const expiring = await admin('POST', '/api/v1/tokens', { name: 'soon', userId: reader.body.id, expiresInDays: 1 });
      await m.manager.store.db
        .updateTable('tokens')
        .set({ expires_at: Date.now() - 1000 })
        .where('id', '=', expiring.body.id)
        .execute();
      const revoked = await admin('POST', '/api/v1/tokens', { name: 'gone' });
      await admin('DELETE', `/api/v1/tokens/${revoked.body.id}`);
      const someCluster = (await admin('GET', '/api/v1/clusters')).body[0].id;
      const before = await snapshot(m.manager);
      const changes: Array<[string, string, unknown]> = [
        ['POST', '/api/v1/clusters', { name: 'intruder' }],
        ['PATCH', `/api/v1/clusters/${someCluster}`, { name: 'owned' }],
        ['PATCH', `/api/v1/clusters/${someCluster}/config`, { candidateParentLimit: 1 }],
        ['DELETE', `/api/v1/clusters/${someCluster}`, undefined],
        ['POST', '/api/v1/users', { name: 'mallory', role: 'admin' }],
        ['POST', '/api/v1/tokens', { name: 'backdoor' }],
        ['DELETE', `/api/v1/tokens/1`, undefined],
        ['POST', '/api/v1/jobs', { type: 'preheat', image: '127.0.0.1:1/x:y' }],
        ['POST', '/api/v1/clusters', { bogus: true }],
      ];
      for (const token of [undefined, 'stl_wrong', ADMIN_TOKEN.slice(0, -1), CLUSTER_TOKEN, expiring.body.token, revoked.body.token]) {
        for (const [method, pathname, body] of changes) {
          const answer = await call(m.url, method, pathname, { token, body });
          assert.equal(answer.status, 401, `${method} ${pathname} with ${token ?? 'no token'} → ${answer.status}`);
          assert.equal(answer.body.error.code, 'unauthorized');
        }
        assert.equal((await call(m.url, 'GET', '/api/v1/clusters', { token })).status, 401, 'reads need a token too');
      }
      assert.deepEqual(await snapshot(m.manager), before);
    });

    test('read-only role: every GET works, every change is refused with 403 and nothing changes', async () => {
      const user = await admin('POST', '/api/v1/users', { name: 'viewer', role: 'read-only' });
      const token = (await admin('POST', '/api/v1/tokens', { name: 'view', userId: user.body.id })).body.token as string;
      for (const pathname of [
        '/api/v1/clusters',
        '/api/v1/schedulers',
        '/api/v1/peers',
        '/api/v1/tasks',
        '/api/v1/jobs',
        '/api/v1/audit',
        '/api/v1/overview',
        '/api/v1/users',
        '/api/v1/tokens',
        '/api/v1/me',
      ]) {
        assert.equal((await call(m.url, 'GET', pathname, { token })).status, 200, pathname);
      }
      const someCluster = (await admin('GET', '/api/v1/clusters')).body[0].id;
      const before = await snapshot(m.manager);
      const changes: Array<[string, string, unknown]> = [
        ['POST', '/api/v1/clusters', { name: 'ro' }],
        ['PATCH', `/api/v1/clusters/${someCluster}`, { name: 'ro' }],
        ['PATCH', `/api/v1/clusters/${someCluster}/config`, { candidateParentLimit: 1 }],
        ['DELETE', `/api/v1/clusters/${someCluster}`, undefined],
        ['POST', '/api/v1/users', { name: 'escalate', role: 'admin' }],
        ['POST', '/api/v1/tokens', { name: 'more' }],
        ['DELETE', '/api/v1/tokens/1', undefined],
        ['POST', '/api/v1/jobs', { type: 'preheat', image: '127.0.0.1:1/x:y' }],
      ];
      for (const [method, pathname, body] of changes) {
        const answer = await call(m.url, method, pathname, { token, body });
        assert.equal(answer.status, 403, `${method} ${pathname}`);
        assert.match(answer.body.error.message, /read-only role/);
      }
      assert.deepEqual(await snapshot(m.manager), before);
    });

    test('keep-alive endpoints take the cluster token, not user tokens; without it nothing changes', async () => {
      const before = await snapshot(m.manager);
      for (const token of [undefined, ADMIN_TOKEN, 'x'.repeat(CLUSTER_TOKEN.length)]) {
        assert.equal(
          (await call(m.url, 'POST', '/api/v1/schedulers/keepalive', { token, body: { hostname: 's', ip: '127.0.0.1', port: 1 } })).status,
          401,
        );
        assert.equal((await call(m.url, 'POST', '/api/v1/peers/keepalive', { token, body: peerBody('sneaky') })).status, 401);
      }
      assert.deepEqual(await snapshot(m.manager), before);
      const bad = await cluster('POST', '/api/v1/peers/keepalive', { ...peerBody('p'), uploadPort: 70000, extra: 1 });
      assert.equal(bad.status, 400);
      assert.match(bad.body.error.message, /body\.uploadPort/);
      assert.match(bad.body.error.message, /body\.extra: unknown field/);
      const badTask = await cluster('POST', '/api/v1/peers/keepalive', {
        ...peerBody('p'),
        tasks: [{ digest: 'md5:1', size: 1, complete: true, bytesFrom: { peer: 0, seed: 0, origin: 0 } }],
      });
      assert.match(badTask.body.error.message, /body\.tasks\.0\.digest/);
      const unknownCluster = await cluster('POST', '/api/v1/schedulers/keepalive', {
        hostname: 's',
        ip: '127.0.0.1',
        port: 1,
        clusterName: 'atlantis',
      });
      assert.equal(unknownCluster.status, 404);
      assert.match(unknownCluster.body.error.message, /clusterName: no scheduler cluster is named "atlantis"/);
    });

    test('scheduler keep-alive returns its cluster settings; a config change reaches it with a new version', async () => {
      const c = (await admin('POST', '/api/v1/clusters', { name: 'cfg', config: { candidateParentLimit: 7 } })).body;
      const first = await cluster('POST', '/api/v1/schedulers/keepalive', {
        hostname: 'sched-a',
        ip: '127.0.0.11',
        port: 8002,
        clusterName: 'cfg',
      });
      assert.equal(first.status, 200, JSON.stringify(first.body));
      assert.equal(first.body.clusterId, c.id);
      assert.equal(first.body.config.candidateParentLimit, 7);
      assert.equal(typeof first.body.configVersion, 'number');
      const again = await cluster('POST', '/api/v1/schedulers/keepalive', {
        hostname: 'sched-a',
        ip: '127.0.0.11',
        port: 8002,
        clusterName: 'cfg',
      });
      assert.equal(again.body.configVersion, first.body.configVersion, 'same settings, same version');
      await admin('PATCH', `/api/v1/clusters/${c.id}/config`, {
        candidateParentLimit: 2,
        topology: [{ key: 'zone', weight: 10, strict: false }],
      });
      const changed = await cluster('POST', '/api/v1/schedulers/keepalive', {
        hostname: 'sched-a',
        ip: '127.0.0.11',
        port: 8002,
        clusterName: 'cfg',
      });
      assert.notEqual(changed.body.configVersion, first.body.configVersion);
      assert.equal(changed.body.config.candidateParentLimit, 2);
      assert.deepEqual(changed.body.config.topology, [{ key: 'zone', weight: 10, strict: false }]);
      const listed = (await admin('GET', `/api/v1/schedulers?clusterId=${c.id}`)).body;
      assert.equal(listed.length, 1);
      schedulerSchema.parse(listed[0]);
      assert.equal(listed[0].address, '127.0.0.11:8002');
    });

    test('silent schedulers and peers turn inactive (and are not handed out); a keep-alive brings them back; all audited', async () => {
      await admin('POST', '/api/v1/clusters', { name: 'quiet', scopes: { hostnames: ['quiet-*'] } });
      const sched = { hostname: 'sched-q', ip: '127.0.0.21', port: 8002, clusterName: 'quiet' };
      await cluster('POST', '/api/v1/schedulers/keepalive', sched);
      const peer = peerBody('quiet-peer', { hostname: 'quiet-1' });
      assert.deepEqual((await cluster('POST', '/api/v1/peers/keepalive', peer)).body.schedulers, ['127.0.0.21:8002']);
      // Liveness window: 3 × 250 ms here. The peer keeps calling; the scheduler does not.
      const deadline = Date.now() + 1_600;
      while (Date.now() < deadline) {
        await cluster('POST', '/api/v1/peers/keepalive', peer);
        await sleep(100);
      }
      assert.deepEqual((await cluster('POST', '/api/v1/peers/keepalive', peer)).body.schedulers, []);
      const schedulers = (await admin('GET', '/api/v1/schedulers?state=inactive')).body as Array<{ address: string }>;
      assert.ok(schedulers.some((s) => s.address === '127.0.0.21:8002'));
      const peers = (await admin('GET', '/api/v1/peers?state=active')).body as Array<{ hostId: string }>;
      assert.ok(
        peers.some((p) => p.hostId === 'quiet-peer'),
        'the peer that kept calling stays active',
      );
      await waitFor(
        async () => (await admin('GET', '/api/v1/peers?state=inactive')).body.some((p: { hostId: string }) => p.hostId === 'quiet-peer'),
        3000,
        'the silent peer to turn inactive',
      );

      await cluster('POST', '/api/v1/schedulers/keepalive', sched);
      assert.deepEqual((await cluster('POST', '/api/v1/peers/keepalive', peer)).body.schedulers, ['127.0.0.21:8002']);
      const audit = (await admin('GET', '/api/v1/audit?limit=1000')).body as Array<{ action: string; target: string; actor: string }>;
      const forScheduler = audit
        .filter((a) => a.target === 'scheduler:127.0.0.21:8002')
        .map((a) => a.action)
        .reverse();
      assert.deepEqual(forScheduler, ['scheduler.register', 'scheduler.inactive', 'scheduler.active']);
      const forPeer = audit
        .filter((a) => a.target === 'peer:quiet-peer')
        .map((a) => a.action)
        .reverse();
      assert.deepEqual(forPeer, ['peer.register', 'peer.inactive', 'peer.active']);
      assert.equal(audit.find((a) => a.action === 'scheduler.inactive')?.actor, 'system');
    });

    test('replicas marking the same silent peer inactive at once change it, and audit it, once', async () => {
      await cluster('POST', '/api/v1/peers/keepalive', peerBody('raced-peer'));
      // Other replicas on this database: their own connection pools on PostgreSQL; this process's
      // one connection on SQLite (one process per SQLite file is its supported setup).
      const others = backend.name === 'postgres' ? await Promise.all([openStore(m.db), openStore(m.db)]) : [];
      try {
        const dbs = [m.manager.store.db, ...others.map((o) => o.db), m.manager.store.db];
        await m.manager.store.db.updateTable('peers').set({ last_keepalive: 0 }).where('host_id', '=', 'raced-peer').execute();
        const results = await Promise.all(dbs.map((db) => markSilentInactive(db, 750)));
        assert.ok(results.reduce((sum, r) => sum + r.peers, 0) <= 1, JSON.stringify(results));
        await waitFor(
          async () => (await admin('GET', '/api/v1/peers?state=inactive')).body.some((p: { hostId: string }) => p.hostId === 'raced-peer'),
          3000,
          'the peer inactive',
        );
        const audit = (await admin('GET', '/api/v1/audit?limit=1000')).body as Array<{ action: string; target: string }>;
        assert.deepEqual(
          audit
            .filter((a) => a.target === 'peer:raced-peer')
            .map((a) => a.action)
            .reverse(),
          ['peer.register', 'peer.inactive'],
        );
      } finally {
        for (const o of others) await o.close();
      }
    });

    test('peers get the active schedulers of the cluster their scopes pick: hostname, CIDR, zone, else the default', async () => {
      const schedulers: unknown[] = [{ hostname: 'sched-default', ip: '127.0.1.5', port: 8002 }];
      // Schedulers keep calling, as they do every few seconds, so none falls out of the liveness window.
      const keepSchedulersAlive = () => Promise.all(schedulers.map((body) => cluster('POST', '/api/v1/schedulers/keepalive', body)));
      const make = async (name: string, scopes: unknown, ip: string) => {
        const c = await admin('POST', '/api/v1/clusters', { name, scopes });
        assert.equal(c.status, 201, JSON.stringify(c.body));
        schedulers.push({ hostname: `sched-${name}`, ip, port: 8002, clusterName: name });
        return c.body.id as number;
      };
      const zone = await make('zone-west', { zones: ['west'] }, '127.0.1.1');
      const wide = await make('cidr-wide', { cidrs: ['127.9.0.0/16'] }, '127.0.1.2');
      const narrow = await make('cidr-narrow', { cidrs: ['127.9.3.0/24'] }, '127.0.1.3');
      const host = await make('gpu-hosts', { hostnames: ['gpu-??'] }, '127.0.1.4');
      const ask = async (hostId: string, ip: string, hostname: string, zoneLabel?: string) => {
        await keepSchedulersAlive();
        const answer = await cluster(
          'POST',
          '/api/v1/peers/keepalive',
          peerBody(hostId, { ip, hostname, labels: zoneLabel ? { zone: zoneLabel, rack: 'r1' } : {} }),
        );
        assert.equal(answer.status, 200, JSON.stringify(answer.body));
        return answer.body as { clusterId: number; schedulers: string[] };
      };
      assert.deepEqual(await ask('s1', '127.200.0.1', 'web-1', 'west'), { clusterId: zone, schedulers: ['127.0.1.1:8002'] });
      assert.deepEqual(await ask('s2', '127.9.8.1', 'web-2', 'west'), { clusterId: wide, schedulers: ['127.0.1.2:8002'] });
      assert.deepEqual(await ask('s3', '127.9.3.7', 'web-3', 'west'), { clusterId: narrow, schedulers: ['127.0.1.3:8002'] });
      assert.deepEqual(await ask('s4', '127.9.3.7', 'gpu-07', 'west'), { clusterId: host, schedulers: ['127.0.1.4:8002'] });
      const fallback = await ask('s5', '127.200.0.2', 'web-5');
      const defaultId = ((await admin('GET', '/api/v1/clusters')).body as Array<{ id: number; isDefault: boolean }>).find(
        (c) => c.isDefault,
      )?.id;
      assert.ok(defaultId !== undefined, 'a default cluster is listed');
      assert.equal(fallback.clusterId, defaultId);
      assert.ok(fallback.schedulers.includes('127.0.1.5:8002'));
      const listed = (await admin('GET', '/api/v1/peers?zone=west')).body as Array<z.infer<typeof peerSchema>>;
      assert.deepEqual(listed.map((p) => p.hostId).sort(), ['s1', 's2', 's3', 's4']);
      for (const p of listed) peerSchema.parse(p);
      assert.deepEqual(listed.find((p) => p.hostId === 's1')?.labels, { zone: 'west', rack: 'r1' });
    });

    test('peer task reports feed the overview ("is P2P working?") and the task list, as numbers', async () => {
      const before = overviewSchema.parse((await admin('GET', '/api/v1/overview')).body);
      const report = (hostId: string, seed: boolean, bytesFrom: { peer: number; seed: number; origin: number }) =>
        cluster(
          'POST',
          '/api/v1/peers/keepalive',
          peerBody(hostId, { seed, tasks: [{ digest: digest(0xabc), size: 3_000_000_000, complete: true, bytesFrom }] }),
        );
      await report('bytes-seed', true, { peer: 0, seed: 0, origin: 3_000_000_000 });
      await report('bytes-a', false, { peer: 2_000_000_000, seed: 1_000_000_000, origin: 0 });
      await report('bytes-b', false, { peer: 2_500_000_000, seed: 500_000_000, origin: 0 });
      const after = overviewSchema.parse((await admin('GET', '/api/v1/overview')).body);
      assert.equal(after.bytes.fromOrigin - before.bytes.fromOrigin, 3_000_000_000);
      assert.equal(after.bytes.fromPeers - before.bytes.fromPeers, 4_500_000_000);
      assert.equal(after.bytes.fromSeeds - before.bytes.fromSeeds, 1_500_000_000);
      assert.equal(typeof after.bytes.p2pRatio, 'number');
      assert.ok(after.peers.seeds >= 1);
      assert.equal(after.tasks, before.tasks + 1);
      // A new report replaces the old one: no double counting.
      await report('bytes-a', false, { peer: 2_000_000_000, seed: 1_000_000_000, origin: 0 });
      assert.equal(overviewSchema.parse((await admin('GET', '/api/v1/overview')).body).bytes.fromPeers, after.bytes.fromPeers);
      const tasks = (await admin('GET', '/api/v1/tasks')).body as Array<{
        digest: string;
        peers: Array<{ hostId: string }>;
        bytesFromOrigin: number;
      }>;
      const task = tasks.find((t) => t.digest === digest(0xabc));
      assert.ok(task, 'the reported task is listed');
      assert.deepEqual(task.peers.map((p) => p.hostId).sort(), ['bytes-a', 'bytes-b', 'bytes-seed']);
      assert.equal(task.bytesFromOrigin, 3_000_000_000);
      const peer = ((await admin('GET', '/api/v1/peers?type=seed')).body as Array<z.infer<typeof peerSchema>>).find(
        (p) => p.hostId === 'bytes-seed',
      );
      assert.ok(peer, 'the seed is listed');
      assert.deepEqual(peer.tasks, { count: 1, complete: 1, bytesFromPeers: 0, bytesFromSeeds: 0, bytesFromOrigin: 3_000_000_000 });
      const metrics = (await call<string>(m.url, 'GET', '/metrics')).body;
      assert.match(metrics, new RegExp(`^starling_manager_peer_reported_bytes\\{source="peer"\\} ${after.bytes.fromPeers}$`, 'm'));
    });

    test('the web console is served from its folder when built (with SPA fallback), a JSON 404 otherwise', async () => {
      const missing = await call(m.url, 'GET', '/');
      assert.equal(missing.status, 404);
      assert.match(missing.body.error.message, /console is not built/);
      const dir = m.config.consoleDir;
      assert.ok(dir, 'the test manager has a console folder');
      await fsp.mkdir(path.join(dir, 'assets'), { recursive: true });
      await fsp.writeFile(path.join(dir, 'index.html'), '<!doctype html><title>Starling</title>');
      await fsp.writeFile(path.join(dir, 'assets', 'app.js'), 'console.log(1)');
      const index = await fetch(`${m.url}/`);
      assert.equal(index.status, 200);
      assert.match(index.headers.get('content-type') ?? '', /text\/html/);
      assert.match(await index.text(), /Starling/);
      const asset = await fetch(`${m.url}/assets/app.js`);
      assert.match(asset.headers.get('content-type') ?? '', /javascript/);
      assert.equal(await asset.text(), 'console.log(1)');
      assert.match(await (await fetch(`${m.url}/jobs/12`)).text(), /Starling/, 'client-side routes get index.html');
      assert.equal((await fetch(`${m.url}/assets/nope.js`)).status, 404);
      // A raw path (fetch would normalise it) that tries to climb out of the folder.
      const climb = await new Promise<{ status: number; body: string }>((resolve, reject) => {
        const url = new URL(m.url);
        http
          .get({ host: url.hostname, port: url.port, path: '/assets/../../../../../etc/passwd' }, (res) => {
            let body = '';
            res.on('data', (chunk: Buffer) => (body += chunk.toString()));
            res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
          })
          .on('error', reject);
      });
      assert.ok(!climb.body.includes('root:'), 'nothing outside the console folder is served');
      assert.equal((await call(m.url, 'GET', '/api/v1/nothing-here')).body.error.code, 'not_found');
    });

    test('a restart keeps clusters, users and tokens', async () => {
      await admin('POST', '/api/v1/clusters', { name: 'durable', scopes: { zones: ['d'] }, config: { backToSourceLimit: 9 } });
      const user = await admin('POST', '/api/v1/users', { name: 'durable-user', role: 'read-only' });
      const token = (await admin('POST', '/api/v1/tokens', { name: 'durable', userId: user.body.id })).body.token as string;
      const clustersBefore = (await admin('GET', '/api/v1/clusters')).body;
      const tokensBefore = (await admin('GET', '/api/v1/tokens')).body;
      m = await m.restart();
      assert.deepEqual((await admin('GET', '/api/v1/clusters')).body, clustersBefore);
      assert.deepEqual((await admin('GET', '/api/v1/tokens')).body, tokensBefore);
      assert.equal((await call(m.url, 'GET', '/api/v1/me', { token })).body.user.name, 'durable-user');
      assert.equal(m.manager.initialAdminToken, undefined);
      const admins = (await admin('GET', '/api/v1/users')).body.filter((u: { name: string }) => u.name === 'admin');
      assert.equal(admins.length, 1, 'the initial admin is created once');
      jobSchema.array().parse((await admin('GET', '/api/v1/jobs')).body);
    });
  });
}
