// `starling manager` as an operator starts it: the initial admin token printed once, state
// kept across restarts, clear errors for bad flags.
import assert from 'node:assert/strict';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { clusterToken, STARLING_CLI } from '../fixtures/peer.js';
import { freePort, makeTempDir, run, spawnService, waitForHttp, type TempDir } from '../fixtures/processes.js';
import { call } from './helpers.js';
import { itemAt } from '../../src/common/indexing.js';

async function startCli(args: string[]) {
  const port = await freePort();
  const token = ['--cluster-token-file', (await clusterToken()).file];
  const service = await spawnService({
    cmd: process.execPath,
    args: [STARLING_CLI, 'manager', '--listen', `127.0.0.1:${port}`, '--log-level', 'warn', ...token, ...args],
    name: 'manager',
  });
  const url = `http://127.0.0.1:${port}`;
  await waitForHttp(`${url}/healthz`, 15_000, service);
  return { service, url };
}

describe('starling manager (CLI)', () => {
  let work: TempDir;
  before(async () => {
    work = await makeTempDir('starling-manager-cli-');
  });
  after(async () => {
    await work?.remove();
  });

  test('prints the initial admin token once, stores only its hash, and keeps state across a restart', async () => {
    const dataDir = path.join(work.path, 'data');
    const first = await startCli(['--data-dir', dataDir]);
    let token: string;
    try {
      const printed = /Initial admin token[^\n]*\n\n\s+(stl_\S+)/.exec(first.service.readLog());
      assert.ok(printed, first.service.logTail());
      token = itemAt(printed, 1);
      assert.equal((await call(first.url, 'GET', '/api/v1/me', { token })).body.user.role, 'admin');
      assert.equal((await call(first.url, 'POST', '/api/v1/clusters', { token, body: { name: 'from-cli' } })).status, 201);
    } finally {
      await first.service.stop();
    }
    for (const file of await fsp.readdir(dataDir)) {
      const bytes = await fsp.readFile(path.join(dataDir, file));
      assert.ok(!bytes.includes(Buffer.from(token)), `the token is not in ${file}`);
    }

    const second = await startCli(['--db', `sqlite:${path.join(dataDir, 'manager.db')}`]);
    try {
      assert.doesNotMatch(second.service.readLog(), /Initial admin token/);
      const clusters = (await call(second.url, 'GET', '/api/v1/clusters', { token })).body as Array<{ name: string }>;
      assert.deepEqual(
        clusters.map((c) => c.name),
        ['default', 'from-cli'],
      );
    } finally {
      await second.service.stop();
    }
  });

  test('takes the database URL from STARLING_MANAGER_DB when --db is not given', async () => {
    const file = path.join(work.path, 'from-env', 'manager.db');
    const port = await freePort();
    const service = await spawnService({
      cmd: process.execPath,
      args: [
        STARLING_CLI,
        'manager',
        '--listen',
        `127.0.0.1:${port}`,
        '--data-dir',
        path.join(work.path, 'unused'),
        '--cluster-token-file',
        (await clusterToken()).file,
        '--log-level',
        'info',
      ],
      env: { STARLING_MANAGER_DB: `sqlite:${file}` },
      name: 'manager',
    });
    try {
      await waitForHttp(`http://127.0.0.1:${port}/readyz`, 15_000, service);
      assert.match(service.readLog(), new RegExp(`"db":"sqlite:${file}"`));
      assert.ok((await fsp.stat(file)).size > 0);
    } finally {
      await service.stop();
    }
  });

  test('takes the admin token from a file', async () => {
    const file = path.join(work.path, 'admin-token');
    await fsp.writeFile(file, 'my-own-admin-token-0123456789\n');
    const m = await startCli(['--data-dir', path.join(work.path, 'other'), '--admin-token-file', file]);
    try {
      assert.doesNotMatch(m.service.readLog(), /Initial admin token/);
      assert.equal((await call(m.url, 'GET', '/api/v1/me', { token: 'my-own-admin-token-0123456789' })).status, 200);
    } finally {
      await m.service.stop();
    }
  });

  test('refuses bad flags and an unreachable database, naming them, exit code 2', async () => {
    const noToken = await run(process.execPath, [STARLING_CLI, 'manager', '--listen', '127.0.0.1:0', '--data-dir', work.path], {
      timeoutMs: 20_000,
    });
    assert.equal(noToken.code, 2, noToken.stderr);
    assert.match(noToken.stderr, /the manager needs the cluster token \(--cluster-token-file/);
    const token = ['--cluster-token-file', (await clusterToken()).file];
    const badDb = await run(process.execPath, [STARLING_CLI, 'manager', '--db', 'mysql://x'], { timeoutMs: 20_000 });
    assert.equal(badDb.code, 2, badDb.stderr);
    assert.match(badDb.stderr, /db: must be sqlite:PATH or postgres:\/\//);
    const port = await freePort();
    const noServer = await run(
      process.execPath,
      [STARLING_CLI, 'manager', '--listen', '127.0.0.1:0', '--db', `postgres://postgres@127.0.0.1:${port}/x`, ...token],
      { timeoutMs: 20_000 },
    );
    assert.equal(noServer.code, 2, noServer.stderr);
    assert.match(noServer.stderr, new RegExp(`postgres://postgres@127.0.0.1:${port}/x: cannot connect: .*ECONNREFUSED`));
    const shortLease = await run(
      process.execPath,
      [STARLING_CLI, 'manager', '--listen', '127.0.0.1:0', '--data-dir', work.path, '--job-lease-ms', '100'],
      { timeoutMs: 20_000 },
    );
    assert.equal(shortLease.code, 2, shortLease.stderr);
    assert.match(shortLease.stderr, /preheat\.leaseMs: .*>=500/);
    const shortToken = path.join(work.path, 'short');
    await fsp.writeFile(shortToken, 'short');
    const bad = await run(
      process.execPath,
      [STARLING_CLI, 'manager', '--listen', '127.0.0.1:0', '--data-dir', work.path, '--admin-token-file', shortToken, ...token],
      { timeoutMs: 20_000 },
    );
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /admin token in .* must be at least 16 characters/);
  });
});
