import assert from 'node:assert/strict';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile, chmod } from 'node:fs/promises';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { parse as parseToml } from 'smol-toml';
import { planContainerdConfig } from '../../src/node-setup/containerd-config.js';
import { NodeSetupError } from '../../src/node-setup/errors.js';
import { fetchNodeLabels, writeNodeLabels } from '../../src/node-setup/node-labels.js';
import { readLabelsFile } from '../../src/peer/labels.js';
import { makeServerCertificate } from '../fixtures/registry.js';
import { mergeHostsToml } from '../../src/node-setup/hosts-toml.js';
import { applyWrites, undoWrites } from '../../src/node-setup/journal.js';
import { defaultRestartCommand, setUpNode, undoNodeSetup } from '../../src/node-setup/node-setup.js';
import { renderRegistriesDropIn } from '../../src/node-setup/registries-conf.js';
import { explainBadRepositoryName } from '../../src/oci/names.js';
import { registryNamespace, splitRegistryNamespace } from '../../src/peer/mirror/upstream.js';
import { setTomlValues, TomlEditError } from '../../src/node-setup/toml-text.js';

// What Debian's containerd 1.6 package installs as /etc/containerd/config.toml.
const DEBIAN_CONFIG = `version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
`;

const CRI = 'plugins."io.containerd.grpc.v1.cri"';

/** Parsed TOML as plain objects (smol-toml's tables have no prototype). */
function parse(text: string): unknown {
  return JSON.parse(JSON.stringify(parseToml(text)));
}
type Doc = Record<string, Record<string, Record<string, Record<string, unknown>>>>;

describe('TOML text edits', () => {
  it('replaces a value in place and leaves every other byte alone', () => {
    const text = '# keep me\nversion = 2\n\n[a]\n  x = "old" # trailing comment\n  y = [\n    "[not a table]",\n  ]\n';
    const out = setTomlValues(text, [{ table: ['a'], key: 'x', value: 'new' }], 'f');
    assert.equal(out, text.replace('"old"', '"new"'));
  });

  it("adds a key at the end of its table, with the table's indentation", () => {
    const out = setTomlValues('[a]\n    x = 1\n[b]\n  z = 3\n', [{ table: ['a'], key: 'y', value: true }], 'f');
    assert.equal(out, '[a]\n    x = 1\n    y = true\n[b]\n  z = 3\n');
  });

  it('appends a missing table, quoting keys that are not bare', () => {
    const out = setTomlValues('version = 2\n', [{ table: ['plugins', 'io.x.cri', 'registry'], key: 'config_path', value: '/d' }], 'f');
    assert.equal(out, 'version = 2\n\n[plugins."io.x.cri".registry]\n  config_path = "/d"\n');
  });

  it('is not fooled by brackets and quotes inside multi-line strings and arrays', () => {
    const text = 'a = """\n[b]\nc = 1\n"""\nd = [\n  [1, 2], # [e]\n]\n[b]\n  k = \'lit\'\n';
    const out = setTomlValues(text, [{ table: ['b'], key: 'k', value: 'v' }], 'f');
    assert.equal(out, text.replace("'lit'", '"v"'));
  });

  it('refuses an edit that would rewrite structure (a key inside an inline table)', () => {
    assert.throws(
      () => setTomlValues('[a]\n  b = { c = 1 }\n', [{ table: ['a', 'b'], key: 'd', value: 2 }], 'cfg.toml'),
      (error: Error) => error instanceof TomlEditError && /cfg\.toml: cannot set a\.b\.d/.test(error.message),
    );
  });

  it('names the line of invalid TOML', () => {
    assert.throws(
      () => setTomlValues('[a]\nb = = 1\n', [{ table: ['a'], key: 'c', value: 1 }], 'cfg.toml'),
      /cfg\.toml is not valid TOML \(line 2/,
    );
  });
});

describe('containerd config plan', () => {
  it('adds config_path to a config without one, and only that', () => {
    const plan = planContainerdConfig(DEBIAN_CONFIG, 'config.toml', {});
    assert.equal(plan.version, 2);
    assert.equal(plan.hostsDir, '/etc/containerd/certs.d');
    assert.deepEqual(plan.changes, [`${CRI}.registry.config_path = "/etc/containerd/certs.d"`]);
    assert.ok(plan.text.startsWith(DEBIAN_CONFIG), 'the original text is kept as it was');
    const doc = parse(plan.text) as Doc;
    assert.equal(doc.plugins?.['io.containerd.grpc.v1.cri']?.registry?.config_path, '/etc/containerd/certs.d');
  });

  it('keeps an existing config_path and uses its first folder', () => {
    const text = `version = 2\n[${CRI}.registry]\n  config_path = "/etc/containerd/certs.d:/etc/docker/certs.d"\n`;
    const plan = planContainerdConfig(text, 'config.toml', {});
    assert.deepEqual(plan.changes, []);
    assert.equal(plan.text, text);
    assert.equal(plan.hostsDir, '/etc/containerd/certs.d');
  });

  it('refuses a --hosts-dir that is not the config_path already set', () => {
    const text = `version = 2\n[${CRI}.registry]\n  config_path = "/a"\n`;
    assert.throws(
      () => planContainerdConfig(text, 'c.toml', { hostsDir: '/b' }),
      /c\.toml already sets .*config_path = "\/a", which is not --hosts-dir \/b/,
    );
  });

  it('adds the snapshotter for lazy pulling, and a second plan changes nothing', () => {
    const first = planContainerdConfig(DEBIAN_CONFIG, 'config.toml', { lazy: { snapshotterSocket: '/run/starling/snapshotter.sock' } });
    assert.equal(first.changes.length, 5);
    const doc = parse(first.text) as Doc;
    assert.deepEqual(doc.proxy_plugins?.starling, { type: 'snapshot', address: '/run/starling/snapshotter.sock' });
    assert.deepEqual(doc.plugins?.['io.containerd.grpc.v1.cri']?.containerd, {
      snapshotter: 'starling',
      disable_snapshot_annotations: false,
    });
    const second = planContainerdConfig(first.text, 'config.toml', { lazy: { snapshotterSocket: '/run/starling/snapshotter.sock' } });
    assert.deepEqual(second.changes, []);
    assert.equal(second.text, first.text);
  });

  it('replaces a snapshotter already chosen, in place', () => {
    const text = `version = 2\n[${CRI}.containerd]\n  snapshotter = "overlayfs"\n  disable_snapshot_annotations = true\n`;
    const plan = planContainerdConfig(text, 'config.toml', { lazy: { snapshotterSocket: '/s' } });
    assert.match(
      plan.text,
      /\[plugins\."io\.containerd\.grpc\.v1\.cri"\.containerd\]\n {2}snapshotter = "starling"\n {2}disable_snapshot_annotations = false\n/,
    );
  });

  it('uses the containerd 2.x names for a version 3 config', () => {
    const plan = planContainerdConfig('version = 3\n', 'config.toml', { lazy: { snapshotterSocket: '/s' } });
    const doc = parse(plan.text) as Doc;
    const images = doc.plugins?.['io.containerd.cri.v1.images'];
    assert.ok(images, 'the 2.x images plugin is configured');
    assert.deepEqual(images.registry, { config_path: '/etc/containerd/certs.d' });
    assert.equal(images.snapshotter, 'starling');
    assert.equal(images.disable_snapshot_annotations, false);
  });

  it('writes a new config only when told which version', () => {
    assert.throws(
      () => planContainerdConfig(undefined, '/etc/containerd/config.toml', {}),
      /does not exist: name the config version to write with --config-version/,
    );
    assert.throws(() => planContainerdConfig('# only a comment\n', 'c.toml', {}), /c\.toml holds no settings/);
    const plan = planContainerdConfig(undefined, 'c.toml', { newConfigVersion: 2 });
    assert.equal((parse(plan.text) as { version: number }).version, 2);
  });

  it('names each bad config: invalid TOML, version 1, an unknown version, deprecated mirrors', () => {
    const cases: Array<[string, RegExp]> = [
      ['version = 2\n[plugins\n', /c\.toml is not valid TOML \(line 2/],
      ['[plugins.cri]\n  x = 1\n', /c\.toml is a version 1 config \(it has no "version" key\)/],
      ['version = 1\n', /version 1 config \(version = 1\)/],
      ['version = 7\n', /c\.toml: unknown config version 7 \(expected 2/],
      ['version = "2"\n', /unknown config version "2"/],
      [
        `version = 2\n[${CRI}.registry.mirrors."docker.io"]\n  endpoint = ["https://m"]\n`,
        /sets .*registry\.mirrors, which containerd refuses together with config_path/,
      ],
    ];
    for (const [text, message] of cases) {
      assert.throws(
        () => planContainerdConfig(text, 'c.toml', {}),
        (error: Error) => error instanceof NodeSetupError && message.test(error.message),
        text,
      );
    }
  });
});

describe('hosts.toml merge', () => {
  const entry = { mirrorUrl: 'http://127.0.0.1:65001', registry: 'reg.example:5000', insecure: false };
  const PRIVATE = `server = "https://reg.example:5000"\n\n# our CA\n[host."https://reg.example:5000"]\n  capabilities = ["pull", "resolve"]\n  ca = "/etc/containerd/certs.d/reg.example:5000/ca.crt"\n`;

  it("puts the mirror before the node's own hosts and keeps them byte for byte", () => {
    const merged = mergeHostsToml(PRIVATE, entry, 'hosts.toml');
    const doc = parse(merged) as { server: string; host: Record<string, { ca?: string; header?: Record<string, string> }> };
    assert.deepEqual(Object.keys(doc.host), ['http://127.0.0.1:65001', 'https://reg.example:5000']);
    assert.equal(doc.server, 'https://reg.example:5000');
    assert.equal(doc.host['http://127.0.0.1:65001']?.header?.['x-starling-registry'], 'reg.example:5000');
    assert.ok(
      merged.endsWith(
        '\n# our CA\n[host."https://reg.example:5000"]\n  capabilities = ["pull", "resolve"]\n  ca = "/etc/containerd/certs.d/reg.example:5000/ca.crt"\n',
      ),
    );
  });

  it('changes nothing on its own output, and follows a new mirror URL', () => {
    const once = mergeHostsToml(PRIVATE, entry, 'hosts.toml');
    assert.equal(mergeHostsToml(once, entry, 'hosts.toml'), once);
    const moved = mergeHostsToml(once, { ...entry, mirrorUrl: 'http://127.0.0.1:7000' }, 'hosts.toml');
    assert.deepEqual(Object.keys((parse(moved) as { host: object }).host), ['http://127.0.0.1:7000', 'https://reg.example:5000']);
  });

  it('writes a new file with the registry as the fallback server', () => {
    const text = mergeHostsToml(undefined, { ...entry, insecure: true }, 'hosts.toml');
    assert.equal((parse(text) as { server: string }).server, 'http://reg.example:5000');
    const fallback = mergeHostsToml(undefined, { ...entry, registry: undefined }, '_default/hosts.toml');
    assert.equal((parse(fallback) as { server?: string }).server, undefined);
  });

  it('refuses a hosts.toml it cannot parse, or one that already names the mirror itself', () => {
    assert.throws(() => mergeHostsToml('[host."x"\n', entry, 'h.toml'), /h\.toml is not valid TOML/);
    assert.throws(
      () => mergeHostsToml('[host."http://127.0.0.1:65001"]\n  capabilities = ["pull"]\n', entry, 'h.toml'),
      /h\.toml already has a \[host\."http:\/\/127\.0\.0\.1:65001"\] table of its own/,
    );
  });
});

describe('registries.conf drop-in', () => {
  it('sends each registry to the mirror under a path that names it, over HTTP when the mirror is plain', () => {
    const text = renderRegistriesDropIn('http://127.0.0.1:65001', [
      { host: 'reg.example:5000', insecure: false },
      { host: '10.0.0.7:5000', insecure: true },
      { host: 'docker.io', insecure: false },
    ]);
    assert.deepEqual(parse(text), {
      registry: [
        {
          prefix: 'reg.example:5000',
          location: 'reg.example:5000',
          mirror: [{ location: '127.0.0.1:65001/starling-registry/reg.example__5000', insecure: true }],
        },
        {
          prefix: '10.0.0.7:5000',
          location: '10.0.0.7:5000',
          insecure: true,
          mirror: [{ location: '127.0.0.1:65001/starling-registry/10.0.0.7__5000', insecure: true }],
        },
        {
          prefix: 'docker.io',
          location: 'docker.io',
          mirror: [{ location: '127.0.0.1:65001/starling-registry/docker.io', insecure: true }],
        },
      ],
    });
  });

  it('the peer reads the registry back from the path, and the name there', () => {
    for (const registry of ['reg.example:5000', '10.0.0.7:5000', 'docker.io', 'my-registry.internal']) {
      const namespace = registryNamespace(registry);
      assert.equal(explainBadRepositoryName(`${namespace}/team/app`), undefined, `${namespace} is a valid repository path`);
      assert.deepEqual(splitRegistryNamespace(`${namespace}/team/app`), { registry, name: 'team/app' });
    }
    assert.equal(splitRegistryNamespace('team/app'), undefined);
    assert.equal(splitRegistryNamespace('starling-registry/reg.example'), undefined, 'a registry and no name');
  });

  it('refuses no registry at all (registries.conf has no entry for every registry) and an IPv6 literal (no path can name it)', () => {
    assert.throws(() => renderRegistriesDropIn('http://127.0.0.1:65001', []), /needs at least one --registry/);
    assert.throws(
      () => renderRegistriesDropIn('http://127.0.0.1:65001', [{ host: '[::1]:5000', insecure: false }]),
      /registry "\[::1\]:5000" cannot be named in a mirror path/,
    );
  });
});

describe('node-setup files and undo', () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'starling-node-setup-'));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('undo gives back each original byte for byte, with its mode, and removes what it created', async () => {
    const root = await mkdtemp(join(dir, 'j-'));
    const kept = join(root, 'kept.toml');
    await writeFile(kept, 'original\n');
    await chmod(kept, 0o600);
    const created = join(root, 'new', 'deep', 'file.toml');
    const backup = join(root, 'backup');
    assert.deepEqual(
      await applyWrites(backup, [
        { path: kept, content: 'one\n' },
        { path: created, content: 'x\n' },
      ]),
      [kept, created],
    );
    // A second run with other content must not replace the saved original.
    await applyWrites(backup, [{ path: kept, content: 'two\n' }]);
    assert.equal(await readFile(kept, 'utf8'), 'two\n');
    assert.deepEqual(await applyWrites(backup, [{ path: kept, content: 'two\n' }]), []);
    await undoWrites(backup, false);
    assert.equal(await readFile(kept, 'utf8'), 'original\n');
    assert.equal((await stat(kept)).mode & 0o777, 0o600);
    assert.equal(existsSync(join(root, 'new')), false);
    assert.equal(existsSync(backup), false);
  });

  it('undo refuses, changing nothing, when a file was edited since node-setup wrote it', async () => {
    const root = await mkdtemp(join(dir, 'j-'));
    const file = join(root, 'f.toml');
    await writeFile(file, 'a\n');
    const backup = join(root, 'backup');
    await applyWrites(backup, [{ path: file, content: 'b\n' }]);
    await writeFile(file, 'edited by hand\n');
    await assert.rejects(undoWrites(backup, false), /changed since node-setup wrote them: .*f\.toml; nothing was undone/);
    assert.equal(await readFile(file, 'utf8'), 'edited by hand\n');
    await undoWrites(backup, true);
    assert.equal(await readFile(file, 'utf8'), 'a\n');
  });

  it('undo takes a file it created and someone removed since as undone (k3s empties its certs.d), but not a removed original', async () => {
    const root = await mkdtemp(join(dir, 'j-'));
    const original = join(root, 'config.toml');
    await writeFile(original, 'a\n');
    const created = join(root, 'certs.d', '_default', 'hosts.toml');
    const backup = join(root, 'backup');
    await applyWrites(backup, [
      { path: original, content: 'b\n' },
      { path: created, content: 'mirror\n' },
    ]);
    await rm(join(root, 'certs.d'), { recursive: true });
    assert.deepEqual(await undoWrites(backup, false), [created, original]);
    assert.equal(await readFile(original, 'utf8'), 'a\n');

    await applyWrites(backup, [{ path: original, content: 'b\n' }]);
    await rm(original);
    await assert.rejects(undoWrites(backup, false), /changed since node-setup wrote them: .*config\.toml/);
  });

  it('restarts only when config.toml changed, and leaves every file alone on bad input', async () => {
    const root = await mkdtemp(join(dir, 'n-'));
    const config = join(root, 'config.toml');
    await writeFile(config, DEBIAN_CONFIG);
    const marker = join(root, 'restarts');
    const restartCommand = ['sh', '-c', `echo restart >> ${marker}`];
    const hostsDir = join(root, 'certs.d');
    const options = {
      containerdConfig: config,
      hostsDir,
      mirror: 'http://127.0.0.1:65001',
      registries: ['reg.example:5000'],
      insecureRegistries: [],
      restart: true,
      restartCommand,
    };
    const first = await setUpNode(options);
    assert.equal(first.restarted, true);
    const second = await setUpNode(options);
    assert.equal(second.restarted, false);
    assert.deepEqual(second.changedFiles, []);
    // A new registry changes only a hosts.toml: no restart.
    const third = await setUpNode({ ...options, registries: ['reg.example:5000', 'other.example'] });
    assert.deepEqual(third.changedFiles, [join(hostsDir, 'other.example', 'hosts.toml')]);
    assert.equal(third.restarted, false);
    assert.equal((await readFile(marker, 'utf8')).trim().split('\n').length, 1);

    const before = await readFile(config, 'utf8');
    await assert.rejects(setUpNode({ ...options, mirror: 'ftp://x' }), /--mirror: "ftp:\/\/x" must be an http\(s\) URL/);
    await assert.rejects(setUpNode({ ...options, registries: ['bad/host'] }), /invalid registry "bad\/host"/);
    assert.equal(await readFile(config, 'utf8'), before);
  });

  it('warns when the hosts folder is on another filesystem than config.toml (in a pod: not mounted)', async () => {
    const root = await mkdtemp(join(dir, 'n-'));
    const config = join(root, 'config.toml');
    await writeFile(config, DEBIAN_CONFIG);
    const options = { containerdConfig: config, mirror: 'http://127.0.0.1:65001', registries: [], insecureRegistries: [], restart: false };
    const same = await setUpNode({ ...options, hostsDir: join(root, 'certs.d') });
    assert.ok(!same.lines.some((l) => l.startsWith('warning')), same.lines.join('\n'));
    await undoNodeSetup({ containerdConfig: config, force: false, restart: false });
    // /dev/shm is a tmpfs of its own on every Linux machine.
    const other = await mkdtemp('/dev/shm/starling-hosts-');
    try {
      const report = await setUpNode({ ...options, hostsDir: join(other, 'certs.d') });
      assert.ok(
        report.lines.some((l) => /^warning: the hosts folder .* is not on the filesystem of .*config\.toml/.test(l)),
        report.lines.join('\n'),
      );
      await undoNodeSetup({ containerdConfig: config, force: false, restart: false });
    } finally {
      await rm(other, { recursive: true, force: true });
    }
  });

  it('a hosts.toml that does not parse stops the run before config.toml is touched', async () => {
    const root = await mkdtemp(join(dir, 'n-'));
    const config = join(root, 'config.toml');
    const hostsDir = join(root, 'certs.d');
    await writeFile(config, DEBIAN_CONFIG);
    await mkdir(join(hostsDir, 'reg.example'), { recursive: true });
    await writeFile(join(hostsDir, 'reg.example', 'hosts.toml'), '[host."https://reg.example"\n');
    await assert.rejects(
      setUpNode({
        containerdConfig: config,
        hostsDir,
        mirror: 'http://127.0.0.1:65001',
        registries: ['reg.example'],
        insecureRegistries: [],
        restart: false,
      }),
      /reg\.example\/hosts\.toml is not valid TOML \(line 1/,
    );
    assert.equal(await readFile(config, 'utf8'), DEBIAN_CONFIG);
    assert.equal(existsSync(join(root, '.starling-node-setup')), false);
  });
});

// What containerd 2.x's `containerd config default` writes, cut to the parts node-setup reads.
const CONTAINERD2_CONFIG = `version = 3
root = '/var/lib/containerd'
state = '/run/containerd'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    disable_snapshot_annotations = true
    discard_unpacked_layers = false

    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = 'registry.k8s.io/pause:3.10'

    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = ''

  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
`;

/** config.toml as k3s (v2, containerd 1.7) renders it with no template of the operator's. */
function k3sRendered(agentDir: string): string {
  return `
# File generated by k3s. DO NOT EDIT. Use config.toml.tmpl instead.
version = 2

[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/rancher/k3s/agent/containerd"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "10010"
  enable_selinux = false
  sandbox_image = "rancher/mirrored-pause:3.6"

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  disable_snapshot_annotations = true

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true

[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "${agentDir}/certs.d"
`;
}

/** config.toml as RKE2 with containerd 2.x renders it (version 3, single-quoted plugin names). */
function rke2RenderedV3(agentDir: string): string {
  return `
# File generated by rke2. DO NOT EDIT. Use config-v3.toml.tmpl instead.
version = 3
root = "/var/lib/rancher/rke2/agent/containerd"
state = "/run/k3s/containerd"

[grpc]
  address = "/run/k3s/containerd/containerd.sock"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  disable_snapshot_annotations = true

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "index.docker.io/rancher/mirrored-pause:3.6"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = "${agentDir}/certs.d"
`;
}

/** What k3s's documentation shows after the base template: a runtime of the operator's own. */
const CUSTOM_RUNTIME = `
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."custom"]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."custom".options]
  BinaryName = "/usr/bin/custom-container-runtime"
`;

describe('node-setup on containerd 2.x (config version 3), k3s and RKE2', () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'starling-node-setup-v3-'));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  /** A node: its files under `root`, a restart command that counts its runs. */
  async function node(name: string) {
    const root = await mkdtemp(join(dir, `${name}-`));
    const marker = join(root, 'restarts.log');
    const restarts = async () => (existsSync(marker) ? (await readFile(marker, 'utf8')).trim().split('\n').length : 0);
    const common = { restart: true, restartCommand: ['sh', '-c', `echo restart >> ${marker}`] };
    const setUp = (containerdConfig: string, more: Partial<Parameters<typeof setUpNode>[0]> = {}) =>
      setUpNode({ containerdConfig, mirror: 'http://127.0.0.1:65001', registries: [], insecureRegistries: [], ...common, ...more });
    const undo = (containerdConfig: string) => undoNodeSetup({ containerdConfig, force: false, ...common });
    return { root, restarts, setUp, undo };
  }

  /** Every file below `root` with its bytes and mode, but the restart log. */
  async function files(root: string): Promise<Record<string, string>> {
    const out: Record<string, string> = {};
    for (const name of await readdir(root, { recursive: true })) {
      const full = join(root, name);
      if (name.endsWith('restarts.log') || (await stat(full)).isDirectory()) continue;
      out[name] = `${((await stat(full)).mode & 0o777).toString(8)} ${(await readFile(full)).toString('base64')}`;
    }
    return out;
  }

  it('a version 3 config.toml: the containerd 2.x names are set in place, a second run changes nothing, --undo gives every byte back', async () => {
    const n = await node('v3');
    const config = join(n.root, 'etc/containerd/config.toml');
    await mkdir(dirname(config), { recursive: true });
    await writeFile(config, CONTAINERD2_CONFIG, { mode: 0o600 });
    const original = await files(n.root);
    const hostsDir = join(n.root, 'etc/containerd/certs.d');

    const first = await n.setUp(config, {
      hostsDir,
      registries: ['reg.example:5000'],
      lazy: { snapshotterSocket: '/run/starling/snapshotter.sock' },
    });
    assert.equal(first.restarted, true);
    const images = "plugins.'io.containerd.cri.v1.images'";
    const text = await readFile(config, 'utf8');
    // Set where they were, in the file's own layout; the proxy plugin's table appended.
    assert.equal(
      text,
      CONTAINERD2_CONFIG.replace("snapshotter = 'overlayfs'", 'snapshotter = "starling"')
        .replace('disable_snapshot_annotations = true', 'disable_snapshot_annotations = false')
        .replace("config_path = ''", `config_path = "${hostsDir}"`) +
        '\n[proxy_plugins.starling]\n  type = "snapshot"\n  address = "/run/starling/snapshotter.sock"\n',
      `${images}: in place`,
    );
    const doc = parse(text) as Doc;
    assert.equal(doc.plugins?.['io.containerd.cri.v1.images']?.registry?.config_path, hostsDir);
    assert.match(await readFile(join(hostsDir, 'reg.example:5000', 'hosts.toml'), 'utf8'), /\[host\."http:\/\/127\.0\.0\.1:65001"\]/);
    assert.equal((await stat(config)).mode & 0o777, 0o600, 'the mode is kept');

    const second = await n.setUp(config, {
      hostsDir,
      registries: ['reg.example:5000'],
      lazy: { snapshotterSocket: '/run/starling/snapshotter.sock' },
    });
    assert.deepEqual(second.changedFiles, []);
    assert.equal(await n.restarts(), 1);

    const undone = await n.undo(config);
    assert.equal(undone.restarted, true);
    assert.deepEqual(await files(n.root), original);
    assert.equal(existsSync(hostsDir), false);
    assert.equal(await n.restarts(), 2);
  });

  it("k3s's config.toml.tmpl of plain TOML is edited in place, config.toml is left to k3s, --undo gives the template back", async () => {
    const n = await node('k3s-plain');
    const agentDir = join(n.root, 'var/lib/rancher/k3s/agent/etc/containerd');
    const config = join(agentDir, 'config.toml');
    await mkdir(agentDir, { recursive: true });
    await writeFile(config, k3sRendered(agentDir));
    // The operator's own full template: a copy of the rendered file with their runtime added.
    const template = join(agentDir, 'config.toml.tmpl');
    await writeFile(template, k3sRendered(agentDir) + CUSTOM_RUNTIME);
    const original = await files(n.root);

    const report = await n.setUp(config, { lazy: { snapshotterSocket: '/s' } });
    assert.deepEqual(report.changedFiles, [template, join(agentDir, 'certs.d', '_default', 'hosts.toml')]);
    assert.equal(await readFile(config, 'utf8'), k3sRendered(agentDir), 'k3s renders config.toml itself');
    const edited = await readFile(template, 'utf8');
    assert.ok(edited.endsWith(CUSTOM_RUNTIME + '\n[proxy_plugins.starling]\n  type = "snapshot"\n  address = "/s"\n'), edited);
    assert.match(
      edited,
      /\[plugins\."io\.containerd\.grpc\.v1\.cri"\.containerd\]\n {2}snapshotter = "starling"\n {2}disable_snapshot_annotations = false\n/,
    );
    assert.equal(await n.restarts(), 1);

    await n.undo(config);
    assert.deepEqual(await files(n.root), original);
    assert.equal(await n.restarts(), 2);
  });

  it('k3s empties certs.d as it restarts: node-setup puts the mirror back in front of the hosts.toml k3s writes, and --undo gives k3s its own files', async () => {
    const n = await node('k3s-restart');
    const agentDir = join(n.root, 'var/lib/rancher/k3s/agent/etc/containerd');
    const config = join(agentDir, 'config.toml');
    const hostsFile = join(agentDir, 'certs.d', 'reg.example', 'hosts.toml');
    await mkdir(dirname(hostsFile), { recursive: true });
    await writeFile(config, k3sRendered(agentDir));
    // What k3s writes from registries.yaml at every start, after emptying certs.d.
    const k3sHosts =
      '# File generated by k3s. DO NOT EDIT.\nserver = "https://reg.example"\n\n[host."https://mirror.internal"]\n  capabilities = ["pull", "resolve"]\n';
    await writeFile(hostsFile, k3sHosts);
    const k3sCopy = join(n.root, 'k3s-hosts.toml');
    await writeFile(k3sCopy, k3sHosts);
    const original = await files(agentDir);
    const marker = join(n.root, 'k3s-restarts.log');
    const k3sRestart = [
      'sh',
      '-c',
      `echo restart >> ${marker}; rm -rf ${agentDir}/certs.d; mkdir -p ${dirname(hostsFile)}; cp ${k3sCopy} ${hostsFile}`,
    ];

    const report = await setUpNode({
      containerdConfig: config,
      mirror: 'http://127.0.0.1:65001',
      registries: ['reg.example'],
      insecureRegistries: [],
      lazy: { snapshotterSocket: '/s' },
      restart: true,
      restartCommand: k3sRestart,
    });
    assert.equal(report.restarted, true);
    assert.ok(
      report.lines.some((l) => l.startsWith(`${hostsFile}: the mirror http://127.0.0.1:65001 put first again`)),
      report.lines.join('\n'),
    );
    const hosts = parse(await readFile(hostsFile, 'utf8')) as { host: Record<string, unknown> };
    assert.deepEqual(Object.keys(hosts.host), ['http://127.0.0.1:65001', 'https://mirror.internal']);

    await undoNodeSetup({ containerdConfig: config, force: false, restart: true, restartCommand: k3sRestart });
    assert.deepEqual(await files(agentDir), original);
    assert.equal((await readFile(marker, 'utf8')).trim().split('\n').length, 2);
  });

  it("RKE2's config-v3.toml.tmpl is made from the rendered version 3 config when there is none, and --undo removes it", async () => {
    const n = await node('rke2-new');
    const agentDir = join(n.root, 'var/lib/rancher/rke2/agent/etc/containerd');
    const config = join(agentDir, 'config.toml');
    await mkdir(agentDir, { recursive: true });
    await writeFile(config, rke2RenderedV3(agentDir));
    const original = await files(n.root);

    const report = await n.setUp(config, { registries: ['reg.example'], lazy: { snapshotterSocket: '/s' } });
    const template = join(agentDir, 'config-v3.toml.tmpl');
    assert.ok(report.changedFiles.includes(template), report.lines.join('\n'));
    assert.equal(existsSync(join(agentDir, 'config.toml.tmpl')), false, 'the version 3 template, not the version 2 one');
    const doc = parse(await readFile(template, 'utf8')) as Doc;
    assert.equal(doc.plugins?.['io.containerd.cri.v1.images']?.snapshotter, 'starling');
    assert.deepEqual(doc.proxy_plugins?.starling, { type: 'snapshot', address: '/s' });
    assert.ok(existsSync(join(agentDir, 'certs.d', 'reg.example', 'hosts.toml')));

    await n.undo(config);
    assert.deepEqual(await files(n.root), original);
  });

  it('k3s\'s `{{ template "base" . }}` template: what the base lacks is appended after the operator\'s TOML, config.toml is left alone, and a re-render changes nothing', async () => {
    const n = await node('k3s-base');
    const agentDir = join(n.root, 'var/lib/rancher/k3s/agent/etc/containerd');
    const config = join(agentDir, 'config.toml');
    await mkdir(agentDir, { recursive: true });
    // An older k3s base, without the registry's config_path: config.toml is the base, then the TOML after it.
    const base = k3sRendered(agentDir).replace(/\n\[plugins\."io\.containerd\.grpc\.v1\.cri"\.registry\]\n.*\n$/, '\n');
    const template = join(agentDir, 'config.toml.tmpl');
    const templateText = `{{ template "base" . }}\n${CUSTOM_RUNTIME}`;
    await writeFile(template, templateText);
    await writeFile(config, base + '\n' + CUSTOM_RUNTIME);
    const original = await files(n.root);
    const hostsDir = join(agentDir, 'certs.d');

    const report = await n.setUp(config, { hostsDir });
    assert.ok(report.changedFiles.includes(template));
    const added = `\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "${hostsDir}"\n`;
    assert.equal(await readFile(template, 'utf8'), templateText + added);
    assert.equal(await readFile(config, 'utf8'), base + '\n' + CUSTOM_RUNTIME, 'k3s renders config.toml itself');

    // Before k3s renders it again (--no-restart), and after: nothing more to change.
    assert.deepEqual((await n.setUp(config, { hostsDir, restart: false })).changedFiles, []);
    await writeFile(config, base + '\n' + CUSTOM_RUNTIME + added);
    assert.deepEqual((await n.setUp(config, { hostsDir })).changedFiles, []);
    assert.equal(await n.restarts(), 1);

    // k3s wrote config.toml since: undo restores what node-setup wrote, and config.toml is k3s's to render.
    await writeFile(config, base + '\n' + CUSTOM_RUNTIME);
    await n.undo(config);
    assert.deepEqual(await files(n.root), original);
  });

  it('RKE2\'s version 3 `{{ template "base" . }}` template, whose base sets config_path: only hosts.toml files are written, no restart', async () => {
    const n = await node('rke2-base');
    const agentDir = join(n.root, 'var/lib/rancher/rke2/agent/etc/containerd');
    const config = join(agentDir, 'config.toml');
    await mkdir(agentDir, { recursive: true });
    await writeFile(
      join(agentDir, 'config-v3.toml.tmpl'),
      '{{- template "base" . -}}\n\n[plugins.\'io.containerd.cri.v1.runtime\'.containerd.runtimes.custom]\n  runtime_type = "io.containerd.runc.v2"\n',
    );
    await writeFile(
      config,
      rke2RenderedV3(agentDir) +
        '[plugins.\'io.containerd.cri.v1.runtime\'.containerd.runtimes.custom]\n  runtime_type = "io.containerd.runc.v2"\n',
    );
    const original = await files(n.root);
    const report = await n.setUp(config, { registries: ['reg.example', 'other.example:5000'] });
    assert.deepEqual(report.changedFiles, [
      join(agentDir, 'certs.d', 'reg.example', 'hosts.toml'),
      join(agentDir, 'certs.d', 'other.example:5000', 'hosts.toml'),
    ]);
    assert.equal(report.restarted, false);
    await n.undo(config);
    assert.deepEqual(await files(n.root), original);
  });

  it('refuses, naming the key and why, what TOML after `{{ template "base" . }}` cannot change (the snapshotter the base sets), and writes nothing', async () => {
    const n = await node('k3s-base-lazy');
    const agentDir = join(n.root, 'var/lib/rancher/k3s/agent/etc/containerd');
    const config = join(agentDir, 'config.toml');
    await mkdir(agentDir, { recursive: true });
    await writeFile(join(agentDir, 'config.toml.tmpl'), `{{ template "base" . }}\n${CUSTOM_RUNTIME}`);
    await writeFile(config, k3sRendered(agentDir) + CUSTOM_RUNTIME);
    const original = await files(n.root);
    await assert.rejects(
      n.setUp(config, { lazy: { snapshotterSocket: '/s' } }),
      (error: Error) =>
        error instanceof NodeSetupError &&
        /config\.toml\.tmpl \(as rendered into .*config\.toml\): cannot set plugins\."io\.containerd\.grpc\.v1\.cri"\.containerd\.snapshotter \(it is "overlayfs" there\): k3s's base template sets it/.test(
          error.message,
        ) &&
        /replace the template with a full one/.test(error.message),
    );
    assert.deepEqual(await files(n.root), original);
    assert.equal(await n.restarts(), 0);
  });

  it('refuses a template it cannot read as TOML (Go actions beyond the base), or one k3s has not rendered since it changed', async () => {
    const n = await node('k3s-go');
    const agentDir = join(n.root, 'var/lib/rancher/rke2/agent/etc/containerd');
    const config = join(agentDir, 'config.toml');
    await mkdir(agentDir, { recursive: true });
    await writeFile(config, 'version = 2\n');
    const template = join(agentDir, 'config.toml.tmpl');
    await writeFile(template, 'version = 2\n{{ if .NodeConfig.AgentConfig.PauseImage }}\nsandbox_image = "x"\n{{ end }}\n');
    await assert.rejects(n.setUp(config), /config\.toml\.tmpl is a Go template \(it holds "\{\{"\)/);
    await writeFile(template, '{{ template "base" . }}\n[x]\n  y = "{{ .NodeConfig.AgentConfig.PauseImage }}"\n');
    await assert.rejects(n.setUp(config), /config\.toml\.tmpl is a Go template \(it holds "\{\{" after \{\{ template "base" \. \}\}\)/);
    await writeFile(template, '{{ template "base" . }}\n[x]\n  y = 1\n');
    await assert.rejects(
      n.setUp(config),
      /config\.toml does not end with the TOML that follows \{\{ template "base" \. \}\} in .*config\.toml\.tmpl: rke2 has not rendered the template since it changed; restart rke2/,
    );
    assert.equal(await readFile(config, 'utf8'), 'version = 2\n');
    assert.equal(existsSync(join(agentDir, '.starling-node-setup')), false);
  });
});

describe('the restart node-setup runs in the host namespaces', () => {
  const HOST = ['nsenter', '--target', '1', '--mount', '--uts', '--ipc', '--net', '--pid', '--'];

  it("restarts containerd with systemctl, in PID 1's namespaces", () => {
    assert.deepEqual(defaultRestartCommand('/etc/containerd/config.toml'), [...HOST, 'systemctl', 'restart', 'containerd']);
    assert.deepEqual(defaultRestartCommand(undefined), [...HOST, 'systemctl', 'restart', 'containerd']);
  });

  /** Runs the part after nsenter with a systemctl that logs its calls and finds `active` units active. */
  async function runOnHost(command: string[], active: string[]): Promise<{ code: number; calls: string[]; stderr: string }> {
    assert.deepEqual(command.slice(0, HOST.length), HOST);
    const bin = await mkdtemp(join(tmpdir(), 'starling-systemctl-'));
    try {
      const log = join(bin, 'calls');
      await writeFile(
        join(bin, 'systemctl'),
        `#!/bin/sh\necho "$*" >> '${log}'\nif [ "$1" = is-active ]; then case " ${active.join(' ')} " in *" $3 "*) exit 0;; esac; exit 3; fi\nexit 0\n`,
        { mode: 0o755 },
      );
      const [program, ...args] = command.slice(HOST.length);
      assert.ok(program, `a command after ${HOST.join(' ')}`);
      const result = await new Promise<{ code: number; stderr: string }>((resolve) => {
        execFile(program, args, { env: { ...process.env, PATH: `${bin}:${process.env.PATH}` } }, (error, _stdout, stderr) =>
          resolve({ code: error ? Number(error.code) : 0, stderr }),
        );
      });
      const calls = existsSync(log) ? (await readFile(log, 'utf8')).trim().split('\n') : [];
      return { ...result, calls };
    } finally {
      await rm(bin, { recursive: true, force: true });
    }
  }

  it("restarts k3s's unit on a server node and k3s-agent's on an agent node, RKE2's likewise, and fails naming them when none runs", async () => {
    const k3s = defaultRestartCommand('/var/lib/rancher/k3s/agent/etc/containerd/config.toml');
    const rke2 = defaultRestartCommand('/var/lib/rancher/rke2/agent/etc/containerd/config.toml');
    assert.deepEqual(k3s.slice(-2), ['k3s', 'k3s-agent']);
    assert.deepEqual(rke2.slice(-2), ['rke2-server', 'rke2-agent']);

    assert.deepEqual((await runOnHost(k3s, ['k3s'])).calls, ['is-active --quiet k3s', 'restart k3s']);
    assert.deepEqual((await runOnHost(k3s, ['k3s-agent'])).calls, [
      'is-active --quiet k3s',
      'is-active --quiet k3s-agent',
      'restart k3s-agent',
    ]);
    assert.deepEqual((await runOnHost(rke2, ['rke2-server'])).calls.at(-1), 'restart rke2-server');
    assert.deepEqual((await runOnHost(rke2, ['rke2-agent'])).calls.at(-1), 'restart rke2-agent');
    const none = await runOnHost(rke2, []);
    assert.equal(none.code, 1);
    assert.deepEqual(none.calls, ['is-active --quiet rke2-server', 'is-active --quiet rke2-agent']);
    assert.match(none.stderr, /none of the units rke2-server rke2-agent is active/);
  });
});

describe('node labels from the Kubernetes API', () => {
  let dir: string;
  let server: https.Server;
  let url: string;
  let caFile: string;
  const requests: Array<{ path: string; authorization: string }> = [];
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'starling-node-labels-'));
    const tls = await makeServerCertificate(dir, '127.0.0.1');
    caFile = tls.caFile;
    server = https.createServer({ cert: await readFile(tls.certFile), key: await readFile(tls.keyFile) }, (req, res) => {
      requests.push({ path: req.url ?? '', authorization: req.headers.authorization ?? '' });
      if (req.headers.authorization !== 'Bearer sa-token') return void res.writeHead(401).end('{"reason":"Unauthorized"}');
      if (req.url !== '/api/v1/nodes/node-a') return void res.writeHead(403).end('{"reason":"Forbidden"}');
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          kind: 'Node',
          metadata: {
            name: 'node-a',
            labels: { 'topology.kubernetes.io/zone': 'z1', 'example.com/rack': 'r7', 'kubernetes.io/hostname': 'node-a' },
          },
        }),
      );
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
    await writeFile(join(dir, 'token'), 'sa-token\n');
  });
  after(async () => {
    server.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('fetches the node with the service account token over TLS, copies the rack label, and the peer reads the file', async () => {
    const labels = await fetchNodeLabels({
      node: 'node-a',
      apiServer: url,
      tokenFile: join(dir, 'token'),
      caFile,
      rackLabel: 'example.com/rack',
    });
    assert.equal(labels.rack, 'r7');
    assert.equal(requests.at(-1)?.authorization, 'Bearer sa-token');
    const file = join(dir, 'labels.yaml');
    await writeNodeLabels(file, labels);
    const read = readLabelsFile(file);
    assert.equal(read.zone, 'z1');
    assert.equal(read.rack, 'r7');
  });

  it('names the problem: a node it may not read, a missing token, an API server it cannot reach', async () => {
    await assert.rejects(
      fetchNodeLabels({ node: 'node-b', apiServer: url, tokenFile: join(dir, 'token'), caFile }),
      /GET \/api\/v1\/nodes\/node-b: HTTP 403 .*the service account needs "get" on nodes/,
    );
    await assert.rejects(
      fetchNodeLabels({ node: 'node-a', apiServer: url, tokenFile: join(dir, 'missing'), caFile }),
      /cannot read the service account token at .*missing/,
    );
    await assert.rejects(
      fetchNodeLabels({ node: 'node-a', apiServer: 'https://127.0.0.1:1', tokenFile: join(dir, 'token'), caFile }),
      /cannot reach the Kubernetes API at https:\/\/127\.0\.0\.1:1/,
    );
  });
});
