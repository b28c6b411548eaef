// The starling CLI as users meet it: clear errors for bad configuration, and the files
// `containerd-config` writes.
import assert from 'node:assert/strict';
import { readFile, writeFile } from 'node:fs/promises';
import { after, before, describe, it } from 'node:test';
import { STARLING_CLI } from '../fixtures/peer.js';
import { makeTempDir, run, type TempDir } from '../fixtures/processes.js';

const starling = (args: string[]) => run(process.execPath, [STARLING_CLI, ...args], { timeoutMs: 20_000 });

describe('starling CLI', () => {
  let work: TempDir;
  before(async () => {
    work = await makeTempDir('starling-cli-');
  });
  after(async () => {
    await work?.remove();
  });

  it('refuses a bad peer configuration, naming each bad key, and exits 2', async () => {
    const config = `${work.path}/peer.yaml`;
    await writeFile(config, 'dataDir: /tmp/x\nstorage:\n  quota: plenty\nmirorr:\n  listen: 1\n');
    const result = await starling(['peer', '--config', config, '--mirror-listen', 'nonsense']);
    assert.equal(result.code, 2);
    assert.match(result.stderr, /invalid configuration/);
    assert.match(result.stderr, /mirror\.listen: expected HOST:PORT/);
    assert.match(result.stderr, /storage\.quota: invalid size "plenty"/);
    assert.match(result.stderr, /unknown key "mirorr"/);
    assert.doesNotMatch(result.stderr, /\n\s+at /, 'no stack trace for a user error');
  });

  it('requires a data directory', async () => {
    const result = await starling(['peer']);
    assert.equal(result.code, 2);
    assert.match(result.stderr, /dataDir: /);
  });

  it('refuses to run a scheduler, or a peer in a swarm, without the cluster token, and TLS files that are half given or do not match', async () => {
    const scheduler = await starling(['scheduler', '--listen', '127.0.0.1:0', '--metrics-listen', '127.0.0.1:0']);
    assert.equal(scheduler.code, 2, scheduler.stderr);
    assert.match(scheduler.stderr, /the scheduler needs the cluster token \(--cluster-token-file/);
    const peer = await starling([
      'peer',
      '--data-dir',
      `${work.path}/p`,
      '--scheduler',
      '127.0.0.1:9',
      '--mirror-listen',
      '127.0.0.1:0',
      '--upload-listen',
      '127.0.0.1:0',
    ]);
    assert.equal(peer.code, 2, peer.stderr);
    assert.match(peer.stderr, /a peer in a swarm needs the cluster token \(--cluster-token-file/);
    const half = await starling(['peer', '--data-dir', `${work.path}/p`, '--tls-cert', '/nonexistent']);
    assert.equal(half.code, 2);
    assert.match(half.stderr, /TLS needs --tls-cert, --tls-key and --tls-ca together; missing --tls-key, --tls-ca/);
    const unreadable = await starling([
      'peer',
      '--data-dir',
      `${work.path}/p`,
      '--tls-cert',
      '/nonexistent',
      '--tls-key',
      '/nonexistent',
      '--tls-ca',
      '/nonexistent',
    ]);
    assert.equal(unreadable.code, 2);
    assert.match(unreadable.stderr, /cannot read the TLS certificate \/nonexistent/);
  });

  it('writes hosts.toml files for containerd, per registry and _default', async () => {
    const hostsDir = `${work.path}/certs.d`;
    const result = await starling([
      'containerd-config',
      '--hosts-dir',
      hostsDir,
      '--mirror',
      'http://127.0.0.1:65001',
      '--registry',
      'registry.example.com',
      '--insecure-registry',
      '127.0.0.1:5000',
    ]);
    assert.equal(result.code, 0, result.stderr);
    const secure = await readFile(`${hostsDir}/registry.example.com/hosts.toml`, 'utf8');
    assert.match(secure, /^server = "https:\/\/registry\.example\.com"$/m);
    assert.match(secure, /^\[host\."http:\/\/127\.0\.0\.1:65001"\]$/m);
    assert.match(secure, /capabilities = \["pull", "resolve"\]/);
    assert.match(secure, /x-starling-registry = "registry\.example\.com"/);
    const insecure = await readFile(`${hostsDir}/127.0.0.1:5000/hosts.toml`, 'utf8');
    assert.match(insecure, /^server = "http:\/\/127\.0\.0\.1:5000"$/m);
    const fallback = await readFile(`${hostsDir}/_default/hosts.toml`, 'utf8');
    assert.doesNotMatch(fallback, /^server/m);
    assert.match(fallback, /\[host\."http:\/\/127\.0\.0\.1:65001"\]/);
  });

  it('refuses a bad registry name or mirror URL', async () => {
    const bad = await starling(['containerd-config', '--hosts-dir', `${work.path}/x`, '--registry', 'a/b']);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /invalid registry "a\/b"/);
    const badMirror = await starling(['containerd-config', '--hosts-dir', `${work.path}/x`, '--mirror', 'ftp://x']);
    assert.equal(badMirror.code, 2);
    assert.match(badMirror.stderr, /mirror URL must be http/);
  });

  it('get refuses targets that name no blob', async () => {
    const result = await starling(['get', 'registry.example.com/app:v1', '-o', `${work.path}/out`]);
    assert.equal(result.code, 2);
    assert.match(result.stderr, /names no blob/);
    const url = await starling(['get', 'http://example.com/file.txt', '-o', `${work.path}/out`]);
    assert.match(url.stderr, /not a registry blob URL/);
  });
});
