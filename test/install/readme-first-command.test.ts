// The README's first command on a fresh machine: Debian 12 with only what such a machine comes
// with and this machine's Node 20 (test/fixtures/fresh-machine.ts; no libfuse3-dev), the
// repository as committed (`git archive HEAD`: uncommitted changes are not what runs), and the
// command exactly as README.md writes it. The mirror must answer on 127.0.0.1:65001 and a blob
// pull through it from a registry that needs no flag (HTTPS, its CA in NODE_EXTRA_CA_CERTS);
// the FUSE addon is skipped with a note, and the commands that need it say how to get it.
//
// Slow: npm ci compiles better-sqlite3 and zstd-napi from source (2-4 min on two shared cores),
// and the Debian tree takes about a minute to build the first time (then it is cached under
// /var/tmp).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { processesInside, startFreshMachine, type FreshMachine } from '../fixtures/fresh-machine.js';
import { pushRandomBlob } from '../fixtures/images.js';
import { pullThrough } from '../fixtures/peer.js';
import { runOk, ServiceExitedError, waitFor, waitForHttp, type Service } from '../fixtures/processes.js';
import { blobBytesSent, startRegistry, type Registry } from '../fixtures/registry.js';

const REPO_ROOT = path.resolve(import.meta.dirname, '../..');
/** Where the checkout is on the fresh machine, as after `git clone` in a home directory. */
const CHECKOUT = '/root/starling';
/** The test registry's certificate inside the machine (its only extra trust). */
const REGISTRY_CA = '/etc/ssl/certs/starling-test-registry.pem';
const MIRROR = 'http://127.0.0.1:65001';
/** Every port `starling up` listens on (it takes fixed ones): they must be free here. */
const UP_PORTS = [65001, 65002, 65011, 65012, 8080, 8002, 8003];

/** The first command of the README's first shell block: the one a newcomer runs first. */
function readmeFirstCommand(): string {
  const readme = fs.readFileSync(path.join(REPO_ROOT, 'README.md'), 'utf8');
  const block = /^```sh\n([\s\S]*?)^```/m.exec(readme)?.[1];
  const command = block?.split('\n').find((line) => line.trim() !== '' && !line.trimStart().startsWith('#'));
  assert.ok(command, 'README.md opens with a ```sh block holding a command');
  return command.trim();
}

function commandLine(pid: number): string {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ');
  } catch {
    return '';
  }
}

function portIsFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });
}

describe("the README's first command on a fresh machine", { timeout: 40 * 60_000 }, () => {
  const command = readmeFirstCommand();
  let machine: FreshMachine | { skip: string };
  let registry: Registry;
  let up: Service | undefined;

  before(async () => {
    registry = await startRegistry({ tls: true });
    machine = await startFreshMachine({ env: { NODE_EXTRA_CA_CERTS: REGISTRY_CA } });
    if ('skip' in machine) return;
    assert.ok(registry.caFile, 'a TLS registry writes its CA');
    await fsp.copyFile(registry.caFile, machine.hostPath(REGISTRY_CA));
    const archive = machine.hostPath('/root/starling.tar');
    await runOk('git', ['-C', REPO_ROOT, 'archive', '--format=tar', '-o', archive, 'HEAD']);
    await fsp.mkdir(machine.hostPath(CHECKOUT));
    await runOk('tar', ['-xf', archive, '-C', machine.hostPath(CHECKOUT)]);
    await fsp.rm(archive);
  });
  after(async () => {
    await up?.stop(20_000);
    if (machine && !('skip' in machine)) await machine.remove();
    await registry?.stop();
  });

  it('installs, builds and starts Starling; a blob pulls through the mirror on 127.0.0.1:65001', async (t) => {
    if ('skip' in machine) return t.skip(machine.skip);
    const dirty = (await runOk('git', ['-C', REPO_ROOT, 'status', '--porcelain', '--untracked-files=no'])).stdout.trim();
    if (dirty) t.diagnostic(`uncommitted changes are not part of this run (it installs HEAD):\n${dirty}`);
    for (const port of UP_PORTS) {
      assert.ok(await portIsFree(port), `port ${port} on 127.0.0.1 is taken by another process, and \`starling up\` listens there`);
    }

    const started = Date.now();
    up = await machine.spawn(`cd ${CHECKOUT} && ${command}`, 'readme-first-command');
    // Its banner first: it is printed once every port is bound, so what answers next is this `up`
    // (on a shared machine another test's server could take 65001 during the minutes of npm ci).
    const service = up;
    await waitFor(
      () => {
        if (!service.running) throw new ServiceExitedError(service);
        return service.readLog().includes('Point containerd at the mirror');
      },
      30 * 60_000,
      'the start-up banner of starling up',
      500,
      (error) => error instanceof ServiceExitedError,
    );
    await waitForHttp(`${MIRROR}/healthz`, 10_000, up);
    t.diagnostic(`the mirror answered ${((Date.now() - started) / 1000).toFixed(0)} s after the command started`);

    const log = up.readLog();
    // npm ci: one line per addon outcome, no compiler chatter, no unreviewed install scripts.
    assert.match(
      log,
      /^starling: native\/fuse skipped: pkg-config is not installed; without it no lazy pulling .* apt-get install fuse3 libfuse3-dev pkg-config, then npm run build:fuse$/m,
    );
    assert.match(log, /native addons built: digest, sendfile\n/);
    assert.doesNotMatch(log, /gyp info|install-scripts/);
    // The banner names the mirror and a containerd-config command that works from the checkout.
    assert.match(log, /peer mirror\s+http:\/\/127\.0\.0\.1:65001/);
    assert.match(log, /^ {2}node dist\/cli\/main\.js containerd-config --hosts-dir \S+ --mirror http:\/\/127\.0\.0\.1:65001$/m);

    const blob = await pushRandomBlob(registry, 'fresh/blob', 6 * 1024 * 1024);
    const pulled = await pullThrough({ url: MIRROR }, registry, 'fresh/blob', blob.digest);
    assert.equal(pulled.status, 200);
    assert.equal(pulled.digest, blob.digest);
    await waitFor(() => blobBytesSent(registry.requests(), blob.digest) >= blob.size, 5000, "the registry's access log").catch(
      () => undefined,
    );
    assert.equal(blobBytesSent(registry.requests(), blob.digest), blob.size, 'one copy from the registry');

    // SIGTERM to `starling up` itself (the shell running the command dies of it without passing it on).
    const upPid = processesInside(machine.root).find((pid) => /^\S*node dist\/cli\/main\.js up /.test(commandLine(pid)));
    assert.ok(upPid, 'starling up runs inside the machine');
    process.kill(upPid, 'SIGTERM');
    assert.deepEqual(await up.exited, { code: 0, signal: null }, `starling up ends cleanly on SIGTERM; log tail:\n${up.logTail()}`);
  });

  it('says what is missing, and how to get it, when a command needs the FUSE addon', async (t) => {
    if ('skip' in machine) return t.skip(machine.skip);
    assert.ok(fs.existsSync(machine.hostPath(`${CHECKOUT}/dist/cli/main.js`)), "the README's command has built dist/");
    for (const args of ['snapshotter --socket /tmp/sn.sock --root /tmp/sn', 'optimize oci:/tmp/in oci:/tmp/out']) {
      const result = await machine.run(`cd ${CHECKOUT} && node dist/cli/main.js ${args}`);
      assert.equal(result.code, 2, `starling ${args}: ${result.stderr}`);
      assert.match(
        result.stderr,
        /^starling: the fuse addon \(native\/fuse\) is not built \(no \S+starling_fuse\.node\); lazy pulling needs it/,
      );
      assert.match(result.stderr, /`apt-get install fuse3 libfuse3-dev pkg-config`\), then run `npm run build:fuse`$/m);
    }
  });
});
