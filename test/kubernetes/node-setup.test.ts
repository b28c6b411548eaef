// `starling node-setup` against a real containerd 1.6 (CRI plugin on, as on a Kubernetes node): a
// node without config_path, and a node whose hosts.toml already reaches a private registry with
// basic auth and a CA of its own. Pulls are kubelet's (CRI PullImage); --undo must give back every
// file byte for byte; bad input must leave the node's files as they were.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { itemAt } from '../../src/common/indexing.js';
import { startContainerd, type Containerd } from '../fixtures/containerd.js';
import { podmanPull } from '../fixtures/clients.js';
import { connectCri, type CriClient } from '../fixtures/cri.js';
import { buildImage, pushImage } from '../fixtures/images.js';
import { startPeer, STARLING_CLI, type RunningPeerProcess } from '../fixtures/peer.js';
import { makeTempDir, run, type RunResult, type TempDir } from '../fixtures/processes.js';
import { blobRequests, startRegistry, type Registry } from '../fixtures/registry.js';

const MiB = 1 << 20;
const CREDS = { user: 'team', password: 'node-setup-secret' };

/** The CA file of a registry started with `tls`. */
function caFileOf(registry: Registry): string {
  assert.ok(registry.caFile, `the registry at ${registry.host} has a CA file (started with tls)`);
  return registry.caFile;
}

describe('starling node-setup on a containerd 1.6 node', () => {
  let tmp: TempDir;
  let origin: Registry;
  let privateRegistry: Registry;
  let peer: RunningPeerProcess;
  let containerd: Containerd;
  let cri: CriClient;
  let restartScript: string;
  let restartLog: string;
  let images = 0;

  const nodeSetup = (args: string[]): Promise<RunResult> =>
    run(process.execPath, [
      STARLING_CLI,
      'node-setup',
      '--containerd-config',
      containerd.configFile,
      '--mirror',
      peer.url,
      '--restart-command',
      restartScript,
      ...args,
    ]);
  const restarts = async () => (existsSync(restartLog) ? (await fsp.readFile(restartLog, 'utf8')).split('\n').filter(Boolean).length : 0);
  const criConfig = async () => {
    const { config } = (await cri.status()).info;
    assert.ok(config, 'the runtime status carries the CRI plugin configuration (info.config)');
    return JSON.parse(config) as { registry: { configPath: string } };
  };

  /** Pushes a fresh image (layers nobody holds yet) and returns its reference and its big layer's digest. */
  async function freshImage(registry: Registry): Promise<{ ref: string; layer: string }> {
    const n = ++images;
    const image = await buildImage({ layers: [{ sizeBytes: 2 * MiB, seed: `node-setup-${n}` }] });
    const pushed = await pushImage(image.layoutDir, image.tag, registry.host, `app/n${n}:v1`, { creds: registry.creds });
    return { ref: pushed.ref, layer: itemAt(image.layers, 0).digest };
  }
  /** Who fetched the layer from the registry: the peer ("starling…") or containerd itself. */
  function fetchedBy(registry: Registry, layer: string): string[] {
    return blobRequests(registry.requests(), layer)
      .filter((r) => r.status === 200)
      .map((r) => (/containerd/.test(r.userAgent) ? 'containerd' : 'peer'));
  }

  before(async () => {
    tmp = await makeTempDir('starling-node-setup-');
    origin = await startRegistry();
    privateRegistry = await startRegistry({ htpasswd: CREDS, tls: true });
    // The peer trusts the private registry's CA as the node does (the manifests mount it the same way).
    peer = await startPeer({ insecure: [origin.host], env: { NODE_EXTRA_CA_CERTS: caFileOf(privateRegistry) } });
    containerd = await startContainerd({ cri: { sandboxImage: `${origin.host}/pause:unused` } });
    cri = connectCri(containerd.address);
    restartLog = path.join(tmp.path, 'restarts.log');
    restartScript = path.join(tmp.path, 'restart-containerd.sh');
    await fsp.writeFile(restartScript, `#!/bin/sh\necho restart >> '${restartLog}'\n`, { mode: 0o755 });
  });

  after(async () => {
    cri?.close();
    await containerd?.stop();
    await peer?.stop();
    await privateRegistry?.stop();
    await origin?.stop();
    await tmp?.remove();
  });

  test('a node without config_path: node-setup adds it and restarts once, pulls go through the mirror, a second run changes nothing, --undo restores config.toml byte for byte', async () => {
    const original = await fsp.readFile(containerd.configFile);
    const hostsDir = path.join(tmp.path, 'certs.d');
    const first = await nodeSetup(['--hosts-dir', hostsDir, '--insecure-registry', origin.host]);
    assert.equal(first.code, 0, first.stderr);
    assert.match(first.stdout, /config\.toml: set plugins\."io\.containerd\.grpc\.v1\.cri"\.registry\.config_path = ".*certs\.d"/);
    assert.match(first.stdout, /restarted containerd/);
    assert.equal(await restarts(), 1);
    await containerd.restart(); // what the restart command does on a real node
    assert.equal((await criConfig()).registry.configPath, hostsDir);

    const { ref, layer } = await freshImage(origin);
    await cri.pullImage(ref);
    assert.deepEqual(fetchedBy(origin, layer), ['peer'], 'one copy, fetched by the peer');

    const files = await snapshot(tmp.path);
    const second = await nodeSetup(['--hosts-dir', hostsDir, '--insecure-registry', origin.host]);
    assert.equal(second.code, 0, second.stderr);
    assert.match(second.stdout, /nothing to change/);
    assert.match(second.stdout, /no restart needed/);
    assert.equal(await restarts(), 1);
    assert.deepEqual(await snapshot(tmp.path), files);

    const undo = await nodeSetup(['--undo']);
    assert.equal(undo.code, 0, undo.stderr);
    assert.deepEqual(await fsp.readFile(containerd.configFile), original);
    assert.equal(existsSync(hostsDir), false, 'the hosts folder node-setup made is gone');
    assert.equal(await restarts(), 2, 'config.toml changed back: one more restart');
    await containerd.restart();
    assert.equal((await criConfig()).registry.configPath, '');
  });

  test('a node whose hosts.toml reaches a private registry (basic auth, its own CA): the mirror goes first, the registry still works through it and without it, --undo restores every file', async () => {
    // The node as its operator left it: config_path set, the private registry's CA in its hosts.toml.
    const hostsDir = path.join(tmp.path, 'etc-containerd-certs.d');
    const registryDir = path.join(hostsDir, privateRegistry.host);
    await fsp.mkdir(registryDir, { recursive: true });
    await fsp.copyFile(caFileOf(privateRegistry), path.join(registryDir, 'ca.crt'));
    const hostsToml = [
      `server = "https://${privateRegistry.host}"`,
      '',
      '# the team registry, with its own CA',
      `[host."https://${privateRegistry.host}"]`,
      '  capabilities = ["pull", "resolve"]',
      `  ca = "${path.join(registryDir, 'ca.crt')}"`,
      '',
    ].join('\n');
    await fsp.writeFile(path.join(registryDir, 'hosts.toml'), hostsToml);
    await fsp.appendFile(containerd.configFile, `\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "${hostsDir}"\n`);
    await containerd.restart();
    const auth = { username: CREDS.user, password: CREDS.password };
    const before = await freshImage(privateRegistry);
    await cri.pullImage(before.ref, auth);
    assert.deepEqual(fetchedBy(privateRegistry, before.layer), ['containerd'], 'before node-setup containerd pulls by itself');

    const nodeFiles = await snapshot(hostsDir);
    const configBefore = await fsp.readFile(containerd.configFile);
    const restartsBefore = await restarts();
    const setup = await nodeSetup(['--registry', privateRegistry.host]);
    assert.equal(setup.code, 0, setup.stderr);
    assert.match(setup.stdout, /containerd config unchanged: no restart needed/);
    assert.equal(await restarts(), restartsBefore);
    assert.deepEqual(await fsp.readFile(containerd.configFile), configBefore);
    const merged = await fsp.readFile(path.join(registryDir, 'hosts.toml'), 'utf8');
    assert.ok(
      merged.indexOf(`[host."${peer.url}"]`) < merged.indexOf(`[host."https://${privateRegistry.host}"]`),
      'the mirror comes first',
    );
    assert.ok(merged.endsWith(hostsToml.slice(hostsToml.indexOf('# the team registry'))), "the node's own entry is kept as it was");

    const through = await freshImage(privateRegistry);
    await cri.pullImage(through.ref, auth);
    assert.deepEqual(fetchedBy(privateRegistry, through.layer), ['peer'], 'credentials reach the registry through the mirror');

    await peer.stop();
    try {
      const direct = await freshImage(privateRegistry);
      await cri.pullImage(direct.ref, auth);
      assert.deepEqual(
        fetchedBy(privateRegistry, direct.layer),
        ['containerd'],
        'with the peer down, containerd falls back to the registry and its CA',
      );
    } finally {
      peer = await peer.restart();
    }

    const again = await nodeSetup(['--registry', privateRegistry.host]);
    assert.match(again.stdout, /nothing to change/);
    const undo = await nodeSetup(['--undo']);
    assert.equal(undo.code, 0, undo.stderr);
    assert.deepEqual(await snapshot(hostsDir), nodeFiles, 'every file under the hosts folder is back byte for byte');
    assert.deepEqual(await fsp.readFile(containerd.configFile), configBefore);
    assert.equal(await restarts(), restartsBefore, 'only hosts.toml changed: no restart either way');
  });

  test("bad input is a clear error (exit code 2) and the node's files stay as they were", async () => {
    const dir = path.join(tmp.path, 'bad');
    const hostsDir = path.join(dir, 'certs.d');
    await fsp.mkdir(path.join(hostsDir, 'reg.example'), { recursive: true });
    await fsp.writeFile(path.join(hostsDir, 'reg.example', 'hosts.toml'), '[host."https://reg.example"\n  capabilities = ["pull"]\n');
    // `config` is the file's text, or 'dir' for a folder where the file should be.
    const cases: Array<{ config: string; args?: string[]; message: RegExp }> = [
      { config: 'version = 2\n[plugins."io.containerd.grpc.v1.cri"\n', message: /config\.toml is not valid TOML \(line 2, column \d+\)/ },
      { config: 'version = 9\n', message: /unknown config version 9 \(expected 2 for containerd 1\.6\/1\.7 or 3 for containerd 2\.x\)/ },
      { config: '[plugins.cri]\n', message: /is a version 1 config/ },
      { config: 'version = 2\n', args: ['--registry', 'reg.example'], message: /reg\.example\/hosts\.toml is not valid TOML \(line 1/ },
      { config: 'dir', message: /cannot read .*config\.toml: EISDIR/ },
    ];
    for (const { config, args = [], message } of cases) {
      const configFile = path.join(dir, 'config.toml');
      await fsp.rm(configFile, { recursive: true, force: true });
      if (config === 'dir') await fsp.mkdir(configFile);
      else await fsp.writeFile(configFile, config);
      const before = await snapshot(dir);
      const result = await run(process.execPath, [
        STARLING_CLI,
        'node-setup',
        '--containerd-config',
        configFile,
        '--hosts-dir',
        hostsDir,
        '--mirror',
        peer.url,
        '--no-restart',
        ...args,
      ]);
      assert.equal(result.code, 2, `${JSON.stringify(config)}: ${result.stdout}${result.stderr}`);
      assert.match(result.stderr, message);
      assert.deepEqual(await snapshot(dir), before, `${JSON.stringify(config)}: no file changed`);
    }
  });
});

describe('starling node-setup on a CRI-O/podman node: a registries.conf.d drop-in', () => {
  let tmp: TempDir;
  const registries: Registry[] = [];
  let peer: RunningPeerProcess;
  let images = 0;

  before(async () => {
    tmp = await makeTempDir('starling-node-setup-podman-');
    registries.push(await startRegistry(), await startRegistry());
    // No --registry-default: each request names its registry in its path.
    peer = await startPeer({ insecure: registries.map((r) => r.host) });
  });
  after(async () => {
    await peer?.stop();
    for (const registry of registries) await registry.stop();
    await tmp?.remove();
  });

  async function freshImage(registry: Registry): Promise<{ ref: string; layer: string }> {
    const n = ++images;
    const image = await buildImage({ layers: [{ sizeBytes: 2 * MiB, seed: `node-setup-podman-${n}` }] });
    const ref = `app/p${n}:v1`;
    await pushImage(image.layoutDir, image.tag, registry.host, ref);
    return { ref, layer: itemAt(image.layers, 0).digest };
  }
  /** Who fetched the layer from the registry: podman itself, or the peer. */
  const fetchedBy = (registry: Registry, layer: string): string[] =>
    blobRequests(registry.requests(), layer)
      .filter((r) => r.status === 200)
      .map((r) => (/containers\/|podman/i.test(r.userAgent) ? 'podman' : 'peer'));

  test('node-setup writes one drop-in for two registries, real podman pulls from each through the peer, a second run changes nothing, --undo removes it and podman pulls straight from the registry again', async () => {
    // podman reads $HOME/.config/containers/registries.conf.d as it reads /etc/containers/registries.conf.d.
    const home = path.join(tmp.path, 'home');
    const dropIns = path.join(home, '.config', 'containers', 'registries.conf.d');
    await fsp.mkdir(dropIns, { recursive: true });
    await fsp.writeFile(path.join(dropIns, '10-node.conf'), '# the node\'s own\n[aliases]\n  "tool" = "registry.example/tools/tool"\n');
    const nodeFiles = await snapshot(home);
    const [first, second] = registries as [Registry, Registry];
    const nodeSetup = (args: string[]) =>
      run(process.execPath, [STARLING_CLI, 'node-setup', '--registries-conf-dir', dropIns, '--mirror', peer.url, ...args]);
    const setupArgs = ['--insecure-registry', first.host, '--insecure-registry', second.host];

    const setup = await nodeSetup(setupArgs);
    assert.equal(setup.code, 0, setup.stderr);
    assert.match(setup.stdout, new RegExp(`50-starling\\.conf: the mirror ${peer.url} for ${first.host}, ${second.host}`));
    const fromOrigin = () => peer.metric('starling_peer_downloaded_bytes_total', { source: 'origin' });
    for (const registry of registries) {
      const { ref, layer } = await freshImage(registry);
      const before = await fromOrigin();
      await podmanPull({ registryHost: registry.host, ref, home });
      assert.deepEqual(fetchedBy(registry, layer), ['peer'], `${registry.host}: the layer came through the peer, once`);
      assert.ok((await fromOrigin()) - before >= 2 * MiB, `${registry.host}: the peer counted the layer it read from the registry`);
    }
    const again = await nodeSetup(setupArgs);
    assert.match(again.stdout, /nothing to change/);

    const undo = await nodeSetup(['--undo']);
    assert.equal(undo.code, 0, undo.stderr);
    assert.match(undo.stdout, /50-starling\.conf: restored/);
    assert.deepEqual(await snapshot(home), nodeFiles, "the drop-in is gone, the node's own file as it was");
    const direct = await freshImage(first);
    await podmanPull({ registryHost: first.host, ref: direct.ref, home });
    assert.deepEqual(fetchedBy(first, direct.layer), ['podman'], 'without the drop-in podman reads the registry itself');
  });
});

/** Every file below `dir` with its bytes (and folders, as null). */
async function snapshot(dir: string): Promise<Record<string, string | null>> {
  const out: Record<string, string | null> = {};
  for (const entry of await fsp.readdir(dir, { withFileTypes: true, recursive: true })) {
    const full = path.join(entry.parentPath, entry.name);
    if (full.endsWith('.log')) continue;
    out[path.relative(dir, full)] = entry.isDirectory() ? null : (await fsp.readFile(full)).toString('base64');
  }
  return out;
}
