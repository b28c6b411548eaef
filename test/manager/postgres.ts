// A throw-away PostgreSQL server from Debian's postgresql package: initdb into a temp dir,
// pg_ctl start on a free loopback port (as the `postgres` user when the tests run as root,
// since the server refuses to run as root), one fresh database per manager under test,
// pg_ctl stop at the end.

import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import pg from 'pg';
import { freePort, makeTempDir, onExitCleanup, runOk, type TempDir } from '../fixtures/processes.js';

export interface Postgres {
  port: number;
  /** A new, empty database; its connection URL. */
  createDatabase(): Promise<string>;
  /** Stops the server, keeping its data (an outage); startServer brings it back on the same port. */
  stopServer(): Promise<void>;
  startServer(): Promise<void>;
  stop(): Promise<void>;
}

function postgresBin(): string {
  const root = '/usr/lib/postgresql';
  const versions = fs.existsSync(root) ? fs.readdirSync(root).filter((v) => fs.existsSync(path.join(root, v, 'bin', 'initdb'))) : [];
  const [newest] = versions.sort((a, b) => Number(b) - Number(a));
  if (!newest) throw new Error('PostgreSQL is not installed (Debian package postgresql; scripts/install-deps.sh installs it)');
  return path.join(root, newest, 'bin');
}

export async function startPostgres(): Promise<Postgres> {
  const bin = postgresBin();
  const tmp: TempDir = await makeTempDir('starling-pg-');
  const asRoot = process.getuid?.() === 0;
  const as = (cmd: string, args: string[]) =>
    asRoot ? runOk('runuser', ['-u', 'postgres', '--', path.join(bin, cmd), ...args]) : runOk(path.join(bin, cmd), args);
  const dataDir = path.join(tmp.path, 'data');
  const logFile = path.join(tmp.path, 'server.log');
  if (asRoot) {
    await fsp.chmod(tmp.path, 0o755);
    await runOk('chown', ['postgres:postgres', tmp.path]);
  }
  await as('initdb', ['-D', dataDir, '-U', 'postgres', '-A', 'trust', '--no-sync', '-E', 'UTF8']);
  const port = await freePort();
  const startServer = () =>
    as('pg_ctl', [
      'start',
      '-w',
      '-t',
      '60',
      '-D',
      dataDir,
      '-l',
      logFile,
      '-o',
      `-p ${port} -k ${tmp.path} -c listen_addresses=127.0.0.1 -c fsync=off`,
    ]);
  await startServer();
  const stopSync = onExitCleanup(() => {
    // The test process died: do not leave a server behind.
    try {
      execFileSync(
        asRoot ? 'runuser' : path.join(bin, 'pg_ctl'),
        asRoot
          ? ['-u', 'postgres', '--', path.join(bin, 'pg_ctl'), 'stop', '-m', 'immediate', '-D', dataDir]
          : ['stop', '-m', 'immediate', '-D', dataDir],
        { stdio: 'ignore' },
      );
    } catch {
      // already stopped
    }
  });
  let counter = 0;
  const admin = `postgres://postgres@127.0.0.1:${port}/postgres`;
  return {
    port,
    async createDatabase() {
      const name = `manager_${process.pid}_${++counter}`;
      const client = new pg.Client({ connectionString: admin });
      await client.connect();
      try {
        await client.query(`CREATE DATABASE ${name}`);
      } finally {
        await client.end();
      }
      return `postgres://postgres@127.0.0.1:${port}/${name}`;
    },
    async stopServer() {
      await as('pg_ctl', ['stop', '-w', '-m', 'fast', '-D', dataDir]);
    },
    async startServer() {
      await startServer();
    },
    async stop() {
      await as('pg_ctl', ['stop', '-w', '-m', 'fast', '-D', dataDir]);
      stopSync();
      await tmp.remove();
    },
  };
}
