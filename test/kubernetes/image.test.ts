// Starling's own image (scripts/image/build-image.ts, cached under /var/tmp between runs): it is
// reproducible and small, every component starts from it with podman, and the peer DaemonSet's
// pod template from deploy/kubernetes runs with `podman kube play` next to the host's containerd,
// whose pulls then go through it: verified, and the registry sends one copy.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import fsp from 'node:fs/promises';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { parseAllDocuments, stringify } from 'yaml';
import { buildStarlingImage, IMAGE_USER, type BuiltStarlingImage } from '../../scripts/image/build-image.js';
import { startContainerd, type Containerd } from '../fixtures/containerd.js';
import { buildImage, imageInfo, pushImage } from '../fixtures/images.js';
import { TOC_DIGEST_ANNOTATION } from '../../src/estargz/index.js';
import { scrapeMetric, STARLING_CLI } from '../fixtures/peer.js';
import { freePort, makeTempDir, onExitCleanup, run, runOk, waitFor, waitForHttp, type TempDir } from '../fixtures/processes.js';
import { blobRequests, makeServerCertificate, startRegistry, type Registry } from '../fixtures/registry.js';

const DEPLOY = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../deploy/kubernetes');
const BUILD_SCRIPT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../scripts/image/build-image.ts');
const MiB = 1 << 20;
// podman here needs limits root can actually set (STACK.md); kube play takes them from containers.conf.
const ULIMITS = ['--ulimit', 'nofile=20000:20000', '--ulimit', 'nproc=4096:4096'];

describe("Starling's image", () => {
  let tmp: TempDir;
  let image: BuiltStarlingImage;
  let imageName: string;
  let env: Record<string, string>;
  const containers: string[] = [];

  const podman = (args: string[], timeoutMs = 120_000) => run('podman', args, { env, timeoutMs });
  /** Waits for `url` to answer, quoting the container's log if it does not. */
  const waitForComponent = (url: string, id: string) =>
    waitForHttp(url, 30_000).catch(async (error) => {
      throw new Error(`${(error as Error).message}\n${await logsOf(id)}`);
    });
  /** `podman run -d` on the host network; returns the container id (removed after the tests). */
  async function startComponent(name: string, args: string[], podmanArgs: string[] = []): Promise<string> {
    const result = await podman(['run', '-d', '--name', `${name}-${process.pid}`, '--network', 'host', ...ULIMITS, ...podmanArgs, imageName, ...args]);
    assert.equal(result.code, 0, `podman run ${name}: ${result.stderr}`);
    const id = result.stdout.trim();
    containers.push(id);
    return id;
  }
  const logsOf = async (id: string) => {
    const logs = await podman(['logs', id]);
    return logs.stdout + logs.stderr;
  };

  before(async () => {
    tmp = await makeTempDir('starling-image-');
    await fsp.writeFile(path.join(tmp.path, 'containers.conf'), '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]\n');
    env = { CONTAINERS_CONF: path.join(tmp.path, 'containers.conf') };
    image = await buildStarlingImage({ log: (line) => console.log(`# ${line}`) });
    imageName = `localhost/starling-test:${image.manifestDigest.slice(7, 19)}`;
    // skopeo, not podman pull: podman would name the image after its folder as well.
    await runOk('skopeo', ['copy', '--quiet', image.ociRef, `containers-storage:${imageName}`], { env });
    onExitCleanup(() => {
      // best effort when a test crashes: the containers and the tag this file made
      for (const id of containers) void run('podman', ['rm', '-f', id]);
    });
  });

  after(async () => {
    for (const id of containers) await podman(['rm', '-f', '-t', '2', id]);
    await podman(['rmi', imageName]);
    await tmp?.remove();
  });

  test('is small, holds no compiler and no dev dependency, and runs as a non-root user by default', async () => {
    console.log(`# image ${image.manifestDigest}: ${(image.size / MiB).toFixed(1)} MiB compressed (${image.layers.map((l) => `${l.name} ${(l.size / MiB).toFixed(1)}`).join(', ')})`);
    assert.ok(image.size < 64 * MiB, `${(image.size / MiB).toFixed(1)} MiB`);
    const check = await podman(['run', '--rm', ...ULIMITS, '--entrypoint', '/bin/sh', imageName, '-c',
      'id -u; ls /usr/bin/gcc /usr/bin/cc /usr/bin/g++ 2>&1; ls /opt/starling/node_modules/typescript /opt/starling/node_modules/vite 2>&1']);
    const lines = check.stdout.trim().split('\n');
    assert.equal(lines[0], String(IMAGE_USER.uid));
    assert.equal(lines.slice(1).filter((l) => !/No such file or directory/.test(l)).length, 0, check.stdout);
  });

  test('loads every native addon and the production dependencies inside the image', async () => {
    const script = [
      "for (const f of ['digest/build/Release/starling_digest', 'fuse/build/Release/starling_fuse', 'sendfile/build/Release/starling_sendfile']) require('/opt/starling/native/' + f + '.node');",
      "const Database = require('/opt/starling/node_modules/better-sqlite3'); new Database(':memory:').prepare('select 1').get();",
      "require('/opt/starling/node_modules/zstd-napi');",
      "console.log('loaded');",
    ].join(' ');
    const result = await podman(['run', '--rm', ...ULIMITS, '--entrypoint', '/usr/local/bin/node', imageName, '-e', script]);
    assert.equal(result.stdout.trim(), 'loaded', result.stderr);
  });

  test('is reproducible: a build from nothing gives the same digests', async () => {
    const again = await buildStarlingImage({ cacheDir: path.join(tmp.path, 'cache'), noCache: true });
    assert.deepEqual(again.layers.map((l) => l.digest), image.layers.map((l) => l.digest));
    assert.equal(again.manifestDigest, image.manifestDigest);
  });

  test('pushes to a registry when one is named, keeping its digest', async () => {
    const registry = await startRegistry();
    try {
      const result = await run(process.execPath, ['--import', 'tsx', BUILD_SCRIPT, '--push', `${registry.host}/starling/starling:test`, '--dest-tls-verify=false'], { timeoutMs: 300_000 });
      assert.equal(result.code, 0, result.stderr);
      assert.match(result.stdout, /size \d+\.\d MiB compressed/);
      assert.match(result.stdout, new RegExp(`pushed to ${registry.host}/starling/starling:test`));
      const pushed = await imageInfo(registry.host, 'starling/starling:test');
      assert.equal(pushed.digest, image.manifestDigest);
    } finally {
      await registry.stop();
    }
  });

  test('converts to eStargz with starling convert, and the converted image still runs', async () => {
    const out = path.join(tmp.path, 'estargz');
    await runOk(process.execPath, [STARLING_CLI, 'convert', image.ociRef, `oci:${out}:esgz`], { timeoutMs: 300_000 });
    const index = JSON.parse(await fsp.readFile(path.join(out, 'index.json'), 'utf8')) as { manifests: Array<{ digest: string }> };
    const manifest = JSON.parse(await fsp.readFile(path.join(out, 'blobs/sha256', index.manifests[0]!.digest.slice(7)), 'utf8')) as {
      layers: Array<{ annotations?: Record<string, string> }>;
    };
    assert.equal(manifest.layers.length, image.layers.length);
    for (const layer of manifest.layers) assert.ok(layer.annotations?.[TOC_DIGEST_ANNOTATION], 'every layer has its TOC digest');
    const converted = `localhost/starling-test-estargz:${process.pid}`;
    await runOk('skopeo', ['copy', '--quiet', `oci:${out}:esgz`, `containers-storage:${converted}`], { env });
    const version = await podman(['run', '--rm', ...ULIMITS, converted, '--version']);
    await podman(['rmi', converted]);
    assert.equal(version.stdout.trim(), '0.1.0', version.stderr);
  });

  test('starts each component with podman: the manager and the scheduler as non-root, a seed, the snapshotter', async () => {
    const managerPort = await freePort();
    const manager = await startComponent('manager', ['manager', `--listen=127.0.0.1:${managerPort}`, '--data-dir=/var/lib/starling/manager']);
    await waitForComponent(`http://127.0.0.1:${managerPort}/healthz`, manager);
    const [schedulerPort, schedulerMetrics] = [await freePort(), await freePort()];
    const scheduler = await startComponent('scheduler', [
      'scheduler', `--listen=127.0.0.1:${schedulerPort}`, `--metrics-listen=127.0.0.1:${schedulerMetrics}`, `--manager=http://127.0.0.1:${managerPort}`,
    ]);
    await waitForComponent(`http://127.0.0.1:${schedulerMetrics}/healthz`, scheduler);
    for (const id of [manager, scheduler]) {
      const user = await podman(['exec', id, 'id', '-u']);
      assert.equal(user.stdout.trim(), String(IMAGE_USER.uid), 'runs as the image\'s non-root user');
    }
    const [seedMirror, seedUpload] = [await freePort(), await freePort()];
    const seed = await startComponent('seed', [
      'peer', '--seed', '--data-dir=/var/lib/starling/seed', `--mirror-listen=127.0.0.1:${seedMirror}`, `--upload-listen=127.0.0.1:${seedUpload}`,
      `--scheduler=127.0.0.1:${schedulerPort}`, `--manager=http://127.0.0.1:${managerPort}`,
    ], ['--user', '0']);
    await waitForComponent(`http://127.0.0.1:${seedMirror}/healthz`, seed);
    const snDir = path.join(tmp.path, 'snapshotter');
    await fsp.mkdir(snDir);
    const snMetrics = await freePort();
    const snapshotter = await startComponent('snapshotter', [
      'snapshotter', `--socket=${snDir}/snapshotter.sock`, `--root=${snDir}/root`, `--peer=http://127.0.0.1:${seedMirror}`, `--metrics-listen=127.0.0.1:${snMetrics}`,
    ], ['--privileged', '--user', '0', '--device', '/dev/fuse', '-v', `${snDir}:${snDir}:rshared`]);
    await waitFor(async () => (await logsOf(snapshotter)).includes('snapshotter ready'), 30_000, 'snapshotter ready');
    // The seed joined the scheduler the manager knows.
    await waitFor(async () => (await scrapeMetric(`http://127.0.0.1:${schedulerMetrics}/metrics`, 'starling_scheduler_hosts')) >= 1, 30_000, 'the seed announced to the scheduler').catch(async (error) => {
      throw new Error(`${(error as Error).message}\n${await logsOf(scheduler)}`);
    });
  });

  describe("the peer DaemonSet's pod template with podman kube play, next to the host's containerd", () => {
    let registry: Registry;
    let containerd: Containerd;
    let apiServer: https.Server;
    let podName: string;
    let podFile: string;
    const initLogs: string[] = [];

    before(async () => {
      registry = await startRegistry();
      // A node whose containerd already names config_path (inside its config folder, which the pod
      // mounts): node-setup then only writes hosts.toml, and no restart is needed.
      containerd = await startContainerd();
      await fsp.appendFile(containerd.configFile, `\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = ${JSON.stringify(containerd.hostsDir)}\n`);
      await containerd.restart();
      apiServer = await startFakeApiServer(tmp.path, { name: 'kubeplay-node', labels: { 'topology.kubernetes.io/zone': 'zone-a', 'topology.kubernetes.io/rack': 'rack-7' } });
    });

    after(async () => {
      if (podFile) await podman(['kube', 'down', podFile]);
      apiServer?.close();
      await containerd?.stop();
      await registry?.stop();
    });

    test('runs node-setup and node-labels, then the peer; a containerd pull through it verifies and costs the registry one copy', async () => {
      const rendered = await renderDefaultOverlay(tmp.path);
      const daemonSet = rendered.find((o: any) => o.kind === 'DaemonSet' && o.metadata.name === 'starling-peer');
      const configMap = rendered.find((o: any) => o.kind === 'ConfigMap' && o.metadata.name === 'starling-node');
      const ports = { mirror: await freePort(), upload: await freePort() };
      const nodeDir = path.dirname(containerd.configFile);
      const dirs = { data: path.join(tmp.path, 'peer-data'), token: path.join(tmp.path, 'token'), serviceAccount: path.join(tmp.path, 'serviceaccount') };
      for (const dir of Object.values(dirs)) await fsp.mkdir(dir, { recursive: true });
      await fsp.writeFile(path.join(dirs.token, 'token'), 'kube-play-cluster-token');
      podName = `starling-peer-${process.pid}`;
      const pod = podFromTemplate(daemonSet, {
        name: podName,
        image: imageName,
        nodeDir,
        ports,
        dirs,
        apiServer: `127.0.0.1:${(apiServer.address() as AddressInfo).port}`,
        registry: registry.host,
      });
      // podman 4.3 starts a pod's init containers without waiting for them to end (and then fails to
      // remove a "once" init container still running, or lets the peer start before its labels
      // exist): each init container runs here as its own pod, in order, to completion.
      const { initContainers, ...mainSpec } = pod.spec;
      for (const init of initContainers) {
        const initPod = { ...pod, metadata: { ...pod.metadata, name: `${podName}-${init.name}` }, spec: { ...mainSpec, restartPolicy: 'Never', containers: [init] } };
        const file = path.join(tmp.path, `${init.name}.yaml`);
        await fsp.writeFile(file, [stringify(configMap), stringify(initPod)].join('---\n'));
        try {
          const played = await podman(['kube', 'play', file], 300_000);
          assert.equal(played.code, 0, `podman kube play ${init.name}: ${played.stderr}${played.stdout}`);
          const container = `${podName}-${init.name}-${init.name}`;
          const exit = await podman(['wait', container], 120_000);
          const logs = await podman(['logs', container]);
          initLogs.push(logs.stdout + logs.stderr);
          assert.equal(exit.stdout.trim(), '0', `${init.name} exited ${exit.stdout}: ${initLogs.at(-1)}`);
        } finally {
          await podman(['kube', 'down', file]);
        }
      }
      podFile = path.join(tmp.path, 'pod.yaml');
      await fsp.writeFile(podFile, [stringify(configMap), stringify({ ...pod, spec: mainSpec })].join('---\n'));
      const played = await podman(['kube', 'play', podFile], 300_000);
      assert.equal(played.code, 0, `podman kube play: ${played.stderr}${played.stdout}`);
      const mirror = `http://127.0.0.1:${ports.mirror}`;
      await waitForHttp(`${mirror}/healthz`, 60_000).catch(async (error) => {
        const logs = await podman(['pod', 'logs', podName]);
        throw new Error(`${(error as Error).message}\n${logs.stdout}${logs.stderr}`);
      });

      // node-setup put the mirror into the node's hosts.toml; node-labels gave the peer its zone and rack.
      const hostsToml = await fsp.readFile(path.join(containerd.hostsDir, registry.host, 'hosts.toml'), 'utf8');
      assert.match(hostsToml, new RegExp(`\\[host\\."${mirror}"\\]`));
      assert.match(initLogs[0]!, /containerd config unchanged: no restart needed/);
      assert.match(initLogs[1]!, /labels of node kubeplay-node \(rack rack-7\)/);

      const built = await buildImage({ layers: [{ sizeBytes: 6 * MiB, seed: 'kube-play' }] });
      const { ref } = await pushImage(built.layoutDir, built.tag, registry.host, 'app/kubeplay:v1');
      await containerd.pull(ref); // ctr checks every blob against its digest
      const layer = built.layers[0]!.digest;
      const gets = blobRequests(registry.requests(), layer).filter((r) => r.status === 200);
      assert.equal(gets.length, 1, 'the registry sent the layer once');
      assert.doesNotMatch(gets[0]!.userAgent, /containerd/, 'to the peer in the pod');
      const stored = (await containerd.ctr(['content', 'get', layer], { timeoutMs: 30_000 })).stdout;
      assert.ok(stored.length > 0);
      assert.equal(await scrapeMetric(`${mirror}/metrics`, 'starling_peer_downloaded_bytes_total', { source: 'origin' }) >= built.layers[0]!.size, true);
    });
  });
});

/** The default overlay rendered from a copy of deploy/kubernetes with the secret files it needs. */
async function renderDefaultOverlay(dir: string): Promise<any[]> {
  const copy = path.join(dir, 'deploy');
  await fsp.cp(DEPLOY, copy, { recursive: true });
  for (const file of ['base/secrets/cluster-token', 'base/secrets/admin-token']) await fsp.writeFile(path.join(copy, file), 'test');
  const result = await runOk('kubectl', ['kustomize', path.join(copy, 'overlays/default')]);
  return parseAllDocuments(result.stdout).map((doc) => doc.toJSON());
}

interface PodInputs {
  name: string;
  image: string;
  /** The folder holding the test node's containerd config.toml (its /etc/containerd). */
  nodeDir: string;
  ports: { mirror: number; upload: number };
  dirs: { data: string; token: string; serviceAccount: string };
  apiServer: string;
  registry: string;
}

/**
 * The DaemonSet's pod template as a Pod, changed only where a single test machine differs from a
 * Kubernetes node: host paths are test folders (mounted at the same path inside, as on a node),
 * ports are free ones (and not declared: podman refuses that on the host network), the scheduler
 * and manager are absent (the peer works alone), the API server is a local one, the downward API's
 * values are given (podman has no node or pod IP), and $(VAR) in args is expanded as kubelet does.
 */
function podFromTemplate(daemonSet: any, inputs: PodInputs): any {
  const spec = structuredClone(daemonSet.spec.template.spec);
  const byName = (list: any[], name: string) => list.find((c) => c.name === name);
  const setup = byName(spec.initContainers, 'node-setup');
  const labels = byName(spec.initContainers, 'node-labels');
  const peer = byName(spec.containers, 'peer');
  for (const c of [...spec.initContainers, ...spec.containers]) c.image = inputs.image;

  setup.args = setup.args.map((a: string) =>
    a
      .replace('--containerd-config=/etc/containerd/config.toml', `--containerd-config=${inputs.nodeDir}/config.toml`)
      .replace('--mirror=http://127.0.0.1:65001', `--mirror=http://127.0.0.1:${inputs.ports.mirror}`)
      .replace('--registry=$(STARLING_REGISTRIES)', `--registry=${inputs.registry}`),
  );
  byName(setup.volumeMounts, 'containerd-config').mountPath = inputs.nodeDir;
  labels.env = [
    { name: 'NODE_NAME', value: 'kubeplay-node' },
    { name: 'RACK_LABEL', value: 'topology.kubernetes.io/rack' },
    { name: 'KUBERNETES_SERVICE_HOST', value: inputs.apiServer.split(':')[0] },
    { name: 'KUBERNETES_SERVICE_PORT', value: inputs.apiServer.split(':')[1] },
  ];
  labels.volumeMounts.push({ name: 'service-account', mountPath: '/var/run/secrets/kubernetes.io/serviceaccount', readOnly: true });
  peer.env = [
    { name: 'NODE_IP', value: '127.0.0.1' },
    { name: 'NODE_NAME', value: 'kubeplay-node' },
  ];
  peer.args = peer.args
    .filter((a: string) => !a.startsWith('--scheduler=') && !a.startsWith('--manager='))
    .map((a: string) =>
      a
        .replace('--mirror-listen=127.0.0.1:65001', `--mirror-listen=127.0.0.1:${inputs.ports.mirror}`)
        .replace('--upload-listen=$(NODE_IP):65002', `--upload-listen=$(NODE_IP):${inputs.ports.upload}`)
        .replace('--quota=50GiB', '--quota=1GiB'),
    );
  peer.args.push(`--insecure-registry=${inputs.registry}`);
  for (const probe of [peer.readinessProbe, peer.livenessProbe]) probe.httpGet.port = inputs.ports.mirror;
  // podman refuses port declarations on the host network (Kubernetes takes them as documentation there).
  delete peer.ports;
  spec.volumes = spec.volumes.map((v: any) => {
    if (v.name === 'containerd-config') return { name: v.name, hostPath: { path: inputs.nodeDir, type: 'Directory' } };
    if (v.name === 'data') return { name: v.name, hostPath: { path: inputs.dirs.data, type: 'Directory' } };
    if (v.name === 'cluster-token') return { name: v.name, hostPath: { path: inputs.dirs.token, type: 'Directory' } };
    return v;
  });
  spec.volumes.push({ name: 'service-account', hostPath: { path: inputs.dirs.serviceAccount, type: 'Directory' } });
  // kubelet expands $(VAR) in args from the container's env; podman does not.
  for (const c of [...spec.initContainers, ...spec.containers]) {
    const values = Object.fromEntries((c.env ?? []).filter((e: any) => e.value !== undefined).map((e: any) => [e.name, e.value]));
    c.args = c.args.map((a: string) => a.replace(/\$\((\w+)\)/g, (whole, name: string) => values[name] ?? whole));
  }
  return { apiVersion: 'v1', kind: 'Pod', metadata: { name: inputs.name, labels: daemonSet.spec.template.metadata.labels }, spec };
}

/** A Kubernetes API server that knows one node, over TLS with a CA of its own, as a pod sees it. */
async function startFakeApiServer(dir: string, node: { name: string; labels: Record<string, string> }): Promise<https.Server> {
  const tlsDir = path.join(dir, 'api-tls');
  await fsp.mkdir(tlsDir);
  const tls = await makeServerCertificate(tlsDir, '127.0.0.1');
  const serviceAccount = path.join(dir, 'serviceaccount');
  await fsp.mkdir(serviceAccount, { recursive: true });
  const token = createHash('sha256').update(String(Math.random())).digest('hex');
  await fsp.writeFile(path.join(serviceAccount, 'token'), token);
  await fsp.copyFile(tls.caFile, path.join(serviceAccount, 'ca.crt'));
  const server = https.createServer({ cert: await fsp.readFile(tls.certFile), key: await fsp.readFile(tls.keyFile) }, (req, res) => {
    if (req.headers.authorization !== `Bearer ${token}`) return void res.writeHead(401).end();
    if (req.url !== `/api/v1/nodes/${node.name}`) return void res.writeHead(404).end();
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ kind: 'Node', metadata: { name: node.name, labels: node.labels } }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return server;
}
