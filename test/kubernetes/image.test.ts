// Starling's own image (scripts/image/build-image.ts, cached under /var/tmp between runs): it is
// reproducible and small, every component starts from it with podman, and the pod templates of
// deploy/kubernetes (manager, scheduler, seed, and the peer DaemonSet next to the host's containerd)
// run with `podman kube play`, talking TLS with the token and certificates of their Secrets; a
// containerd pull then goes through the peer: verified, from the seed, one copy from the registry.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import fsp from 'node:fs/promises';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { Agent, request } from 'undici';
import { parseAllDocuments, stringify } from 'yaml';
import { buildStarlingImage, IMAGE_USER, type BuiltStarlingImage } from '../../scripts/image/build-image.js';
import { startContainerd, type Containerd } from '../fixtures/containerd.js';
import { buildImage, imageInfo, pushImage } from '../fixtures/images.js';
import { itemAt } from '../../src/common/indexing.js';
import { TOC_DIGEST_ANNOTATION } from '../../src/estargz/index.js';
import { scrapeMetric, STARLING_CLI } from '../fixtures/peer.js';
import {
  freePort,
  makeTempDir,
  onExitCleanup,
  run,
  runOk,
  waitFor,
  waitForHttp,
  type RunResult,
  type TempDir,
} from '../fixtures/processes.js';
import { blobBytesSent, blobRequests, makeServerCertificate, startRegistry, type Registry } from '../fixtures/registry.js';

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
  let cluster: ClusterFiles;
  const containers: string[] = [];

  const podman = (args: string[], timeoutMs = 120_000) => run('podman', args, { env, timeoutMs });
  /** Waits for `url` to answer, quoting the container's log if it does not. */
  const waitForComponent = (url: string, id: string, dispatcher?: Agent) =>
    waitForHttp(url, 30_000, undefined, dispatcher).catch(async (error) => {
      throw new Error(`${(error as Error).message}\n${await logsOf(id)}`);
    });
  /** `podman run -d` on the host network; returns the container id (removed after the tests). */
  async function startComponent(name: string, args: string[], podmanArgs: string[] = []): Promise<string> {
    const result = await podman([
      'run',
      '-d',
      '--name',
      `${name}-${process.pid}`,
      '--network',
      'host',
      ...ULIMITS,
      ...podmanArgs,
      imageName,
      ...args,
    ]);
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
    await fsp.writeFile(
      path.join(tmp.path, 'containers.conf'),
      '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]\n',
    );
    env = { CONTAINERS_CONF: path.join(tmp.path, 'containers.conf') };
    image = await buildStarlingImage({ log: (line) => console.log(`# ${line}`) });
    imageName = `localhost/starling-test:${image.manifestDigest.slice(7, 19)}`;
    // skopeo, not podman pull: podman would name the image after its folder as well.
    await runOk('skopeo', ['copy', '--quiet', image.ociRef, `containers-storage:${imageName}`], { env });
    cluster = await prepareCluster(tmp.path, podman, imageName);
    onExitCleanup(() => {
      // best effort when a test crashes: the containers and the tag this file made
      for (const id of containers) void run('podman', ['rm', '-f', id]);
    });
  });

  after(async () => {
    for (const id of containers) await podman(['rm', '-f', '-t', '2', id]);
    await podman(['rmi', imageName]);
    await cluster?.agent.close();
    await tmp?.remove();
  });

  test('is small, holds no compiler and no dev dependency, and runs as a non-root user by default', async () => {
    console.log(
      `# image ${image.manifestDigest}: ${(image.size / MiB).toFixed(1)} MiB compressed (${image.layers.map((l) => `${l.name} ${(l.size / MiB).toFixed(1)}`).join(', ')})`,
    );
    assert.ok(image.size < 64 * MiB, `${(image.size / MiB).toFixed(1)} MiB`);
    const check = await podman([
      'run',
      '--rm',
      ...ULIMITS,
      '--entrypoint',
      '/bin/sh',
      imageName,
      '-c',
      'id -u; ls /usr/bin/gcc /usr/bin/cc /usr/bin/g++ 2>&1; ls /opt/starling/node_modules/typescript /opt/starling/node_modules/vite 2>&1',
    ]);
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
    assert.deepEqual(
      again.layers.map((l) => l.digest),
      image.layers.map((l) => l.digest),
    );
    assert.equal(again.manifestDigest, image.manifestDigest);
  });

  test('pushes to a registry when one is named, keeping its digest', async () => {
    const registry = await startRegistry();
    try {
      const result = await run(
        process.execPath,
        ['--import', 'tsx', BUILD_SCRIPT, '--push', `${registry.host}/starling/starling:test`, '--dest-tls-verify=false'],
        { timeoutMs: 300_000 },
      );
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
    const manifest = JSON.parse(await fsp.readFile(path.join(out, 'blobs/sha256', itemAt(index.manifests, 0).digest.slice(7)), 'utf8')) as {
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

  test('starts each component with podman: the manager and the scheduler as non-root, a seed, the snapshotter, with the cluster token and TLS', async () => {
    const mounts = ['-v', `${cluster.secrets['starling-cluster-token']}:/etc/starling/cluster:ro`];
    const tlsOf = (secret: string) => ['-v', `${cluster.secrets[secret]}:/etc/starling/tls:ro`];
    const tlsFlags = [
      '--tls-cert=/etc/starling/tls/tls.crt',
      '--tls-key=/etc/starling/tls/tls.key',
      '--tls-ca=/etc/starling/tls/ca.crt',
      '--cluster-token-file=/etc/starling/cluster/token',
    ];
    const managerPort = await freePort();
    const manager = await startComponent(
      'manager',
      ['manager', `--listen=127.0.0.1:${managerPort}`, '--data-dir=/var/lib/starling/manager', ...tlsFlags],
      [...mounts, ...tlsOf('starling-manager-tls')],
    );
    await waitForComponent(`https://127.0.0.1:${managerPort}/healthz`, manager, cluster.agent);
    const [schedulerPort, schedulerMetrics] = [await freePort(), await freePort()];
    const scheduler = await startComponent(
      'scheduler',
      [
        'scheduler',
        `--listen=127.0.0.1:${schedulerPort}`,
        `--metrics-listen=127.0.0.1:${schedulerMetrics}`,
        `--manager=https://127.0.0.1:${managerPort}`,
        ...tlsFlags,
      ],
      [...mounts, ...tlsOf('starling-scheduler-tls')],
    );
    await waitForComponent(`http://127.0.0.1:${schedulerMetrics}/healthz`, scheduler);
    for (const id of [manager, scheduler]) {
      const user = await podman(['exec', id, 'id', '-u']);
      assert.equal(user.stdout.trim(), String(IMAGE_USER.uid), "runs as the image's non-root user");
    }
    const [seedMirror, seedUpload] = [await freePort(), await freePort()];
    const seed = await startComponent(
      'seed',
      [
        'peer',
        '--seed',
        '--data-dir=/var/lib/starling/seed',
        `--mirror-listen=127.0.0.1:${seedMirror}`,
        `--upload-listen=127.0.0.1:${seedUpload}`,
        `--scheduler=127.0.0.1:${schedulerPort}`,
        `--manager=https://127.0.0.1:${managerPort}`,
        ...tlsFlags,
      ],
      ['--user', '0', ...mounts, ...tlsOf('starling-peer-tls')],
    );
    await waitForComponent(`http://127.0.0.1:${seedMirror}/healthz`, seed);
    const snDir = path.join(tmp.path, 'snapshotter');
    await fsp.mkdir(snDir);
    const snMetrics = await freePort();
    const snapshotter = await startComponent(
      'snapshotter',
      [
        'snapshotter',
        `--socket=${snDir}/snapshotter.sock`,
        `--root=${snDir}/root`,
        `--peer=http://127.0.0.1:${seedMirror}`,
        `--metrics-listen=127.0.0.1:${snMetrics}`,
      ],
      ['--privileged', '--user', '0', '--device', '/dev/fuse', '-v', `${snDir}:${snDir}:rshared`],
    );
    await waitFor(async () => (await logsOf(snapshotter)).includes('snapshotter ready'), 30_000, 'snapshotter ready');
    // The seed joined the scheduler the manager knows.
    await waitFor(
      async () => (await scrapeMetric(`http://127.0.0.1:${schedulerMetrics}/metrics`, 'starling_scheduler_hosts')) >= 1,
      30_000,
      'the seed announced to the scheduler',
    ).catch(async (error) => {
      throw new Error(`${(error as Error).message}\n${await logsOf(scheduler)}`);
    });
  });

  describe("the pod templates of the default overlay with podman kube play — the manager, the scheduler, a seed and the peer DaemonSet next to the host's containerd — with the token and certificates of their Secrets", () => {
    let registry: Registry;
    let containerd: Containerd;
    let apiServer: https.Server;
    const podFiles: string[] = [];
    const initLogs: string[] = [];
    const ports = { manager: 0, scheduler: 0, schedulerMetrics: 0, seedMirror: 0, seedUpload: 0, mirror: 0, upload: 0 };

    before(async () => {
      for (const key of Object.keys(ports) as Array<keyof typeof ports>) ports[key] = await freePort();
      registry = await startRegistry();
      // A node whose containerd already names config_path (inside its config folder, which the pod
      // mounts): node-setup then only writes hosts.toml, and no restart is needed.
      containerd = await startContainerd();
      await fsp.appendFile(
        containerd.configFile,
        `\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = ${JSON.stringify(containerd.hostsDir)}\n`,
      );
      await containerd.restart();
      apiServer = await startFakeApiServer(tmp.path, {
        name: 'kubeplay-node',
        labels: { 'topology.kubernetes.io/zone': 'zone-a', 'topology.kubernetes.io/rack': 'rack-7' },
      });
    });

    after(async () => {
      for (const file of podFiles.reverse()) await podman(['kube', 'down', file]);
      apiServer?.close();
      await containerd?.stop();
      await registry?.stop();
    });

    /** `podman kube play` of one pod; returns after it started (its file is taken down after the tests). */
    async function play(pod: any): Promise<void> {
      const file = path.join(tmp.path, `${pod.metadata.name}.yaml`);
      await fsp.writeFile(file, stringify(pod));
      podFiles.push(file);
      const played = await podman(['kube', 'play', file], 300_000);
      assert.equal(played.code, 0, `podman kube play ${pod.metadata.name}: ${played.stderr}${played.stdout}`);
    }
    /** Waits for `url`, quoting the pod's logs if it does not answer. */
    const waitForPod = (url: string, pod: string, dispatcher?: Agent) =>
      waitForHttp(url, 60_000, undefined, dispatcher).catch(async (error) => {
        const logs = await podman(['pod', 'logs', pod]);
        throw new Error(`${(error as Error).message}\n${logs.stdout}${logs.stderr}`);
      });

    test('they find each other over TLS with the cluster token; a containerd pull through the peer verifies, its pieces come from the seed, and the registry sends one copy', async () => {
      const workload = (kind: string, name: string) => {
        const object = cluster.objects.find((o: any) => o.kind === kind && o.metadata.name === name);
        assert.ok(object, `${kind}/${name} in the default overlay`);
        return object;
      };
      const services = {
        'starling-manager:8080': `127.0.0.1:${ports.manager}`,
        'starling-scheduler-0.starling-scheduler:8002': `127.0.0.1:${ports.scheduler}`,
      };
      const folder = async (name: string, owner = 0) => {
        const dir = path.join(tmp.path, 'volumes', name);
        await fsp.mkdir(dir, { recursive: true });
        await fsp.chown(dir, owner, owner);
        return dir;
      };
      const pid = process.pid;

      // The manager (SQLite on its volume) and the scheduler, as non-root as their manifests say.
      const managerPod = podFromTemplate(workload('Deployment', 'starling-manager'), {
        name: `starling-manager-${pid}`,
        image: imageName,
        services,
        secrets: cluster.secrets,
        env: {},
        flags: { '--listen': `127.0.0.1:${ports.manager}` },
        folders: { data: await folder('manager', IMAGE_USER.uid) },
        probePort: ports.manager,
      });
      await play(managerPod);
      // The manager's certificate names 127.0.0.1 (a port-forward): checked in full here, names included.
      await waitForPod(`https://127.0.0.1:${ports.manager}/healthz`, managerPod.metadata.name, new Agent({ connect: { ca: cluster.ca } }));
      await assert.rejects(
        request(`http://127.0.0.1:${ports.manager}/healthz`, { headersTimeout: 5_000 }),
        "no plain HTTP on the manager's port",
      );

      const schedulerPod = podFromTemplate(workload('StatefulSet', 'starling-scheduler'), {
        name: `starling-scheduler-${pid}`,
        image: imageName,
        services,
        secrets: cluster.secrets,
        env: { POD_IP: '127.0.0.1' },
        flags: { '--listen': `127.0.0.1:${ports.scheduler}`, '--metrics-listen': `127.0.0.1:${ports.schedulerMetrics}` },
        folders: {},
        probePort: ports.schedulerMetrics,
      });
      await play(schedulerPod);
      const schedulerMetrics = `http://127.0.0.1:${ports.schedulerMetrics}`;
      await waitForPod(`${schedulerMetrics}/healthz`, schedulerPod.metadata.name);

      // A seed on its volume, reading the test's plain-HTTP registry.
      const seedPod = podFromTemplate(workload('StatefulSet', 'starling-seed'), {
        name: `starling-seed-${pid}`,
        image: imageName,
        services,
        secrets: cluster.secrets,
        env: { POD_IP: '127.0.0.1', POD_NAME: 'starling-seed-0' },
        flags: {
          '--mirror-listen': `127.0.0.1:${ports.seedMirror}`,
          '--upload-listen': `127.0.0.1:${ports.seedUpload}`,
          '--quota': '1GiB',
        },
        extraArgs: { seed: [`--insecure-registry=${registry.host}`] },
        folders: { data: await folder('seed', IMAGE_USER.uid) },
        probePort: ports.seedUpload,
      });
      await play(seedPod);
      await waitForPod(`https://127.0.0.1:${ports.seedUpload}/healthz`, seedPod.metadata.name, cluster.agent);

      // The peer: its init containers first, each as a pod of its own run to completion (podman 4.3
      // starts a pod's init containers without waiting for them to end), then the peer.
      const nodeDir = path.dirname(containerd.configFile);
      const serviceAccount = path.join(tmp.path, 'serviceaccount');
      const peerPod = podFromTemplate(workload('DaemonSet', 'starling-peer'), {
        name: `starling-peer-${pid}`,
        image: imageName,
        services,
        secrets: cluster.secrets,
        env: {
          NODE_IP: '127.0.0.1',
          NODE_NAME: 'kubeplay-node',
          STARLING_REGISTRIES: registry.host,
          RACK_LABEL: 'topology.kubernetes.io/rack',
        },
        flags: {
          '--containerd-config': `${nodeDir}/config.toml`,
          '--mirror': `http://127.0.0.1:${ports.mirror}`,
          '--mirror-listen': `127.0.0.1:${ports.mirror}`,
          '--upload-listen': `127.0.0.1:${ports.upload}`,
          '--quota': '1GiB',
        },
        extraArgs: { peer: [`--insecure-registry=${registry.host}`] },
        folders: { data: await folder('peer'), 'containerd-config': nodeDir, 'node-labels': await folder('node-labels', IMAGE_USER.uid) },
        probePort: ports.mirror,
      });
      const { initContainers, ...mainSpec } = peerPod.spec;
      // node-setup edits the node's config where the node has it (the same path inside and out).
      initContainers.find((c: any) => c.name === 'node-setup').volumeMounts.find((m: any) => m.name === 'containerd-config').mountPath =
        nodeDir;
      // node-labels reaches the test's API server with the service account a pod is given.
      const labels = initContainers.find((c: any) => c.name === 'node-labels');
      const [apiHost, apiPort] = [(apiServer.address() as AddressInfo).address, String((apiServer.address() as AddressInfo).port)];
      labels.env.push({ name: 'KUBERNETES_SERVICE_HOST', value: apiHost }, { name: 'KUBERNETES_SERVICE_PORT', value: apiPort });
      labels.volumeMounts.push({ name: 'service-account', mountPath: '/var/run/secrets/kubernetes.io/serviceaccount', readOnly: true });
      mainSpec.volumes.push({ name: 'service-account', hostPath: { path: serviceAccount, type: 'Directory' } });
      for (const init of initContainers) {
        const initPod = {
          ...peerPod,
          metadata: { ...peerPod.metadata, name: `${peerPod.metadata.name}-${init.name}` },
          spec: { ...mainSpec, restartPolicy: 'Never', containers: [init] },
        };
        const file = path.join(tmp.path, `${init.name}.yaml`);
        await fsp.writeFile(file, stringify(initPod));
        try {
          const played = await podman(['kube', 'play', file], 300_000);
          assert.equal(played.code, 0, `podman kube play ${init.name}: ${played.stderr}${played.stdout}`);
          const container = `${initPod.metadata.name}-${init.name}`;
          const exit = await podman(['wait', container], 120_000);
          const logs = await podman(['logs', container]);
          initLogs.push(logs.stdout + logs.stderr);
          assert.equal(exit.stdout.trim(), '0', `${init.name} exited ${exit.stdout}: ${initLogs.at(-1)}`);
        } finally {
          await podman(['kube', 'down', file]);
        }
      }
      await play({ ...peerPod, spec: mainSpec });
      const mirror = `http://127.0.0.1:${ports.mirror}`;
      await waitForPod(`${mirror}/healthz`, peerPod.metadata.name);

      // node-setup put the mirror into the node's hosts.toml; node-labels gave the peer its zone and rack.
      const hostsToml = await fsp.readFile(path.join(containerd.hostsDir, registry.host, 'hosts.toml'), 'utf8');
      assert.match(hostsToml, new RegExp(`\\[host\\."${mirror}"\\]`));
      assert.match(itemAt(initLogs, 0), /containerd config unchanged: no restart needed/);
      assert.match(itemAt(initLogs, 1), /labels of node kubeplay-node \(rack rack-7\)/);
      // The seed and the peer announced themselves over the scheduler's TLS port, with the token.
      await waitFor(
        async () => (await scrapeMetric(`${schedulerMetrics}/metrics`, 'starling_scheduler_hosts')) >= 2,
        30_000,
        'the seed and the peer announced to the scheduler',
      ).catch(async (error) => {
        const logs = await podman(['pod', 'logs', schedulerPod.metadata.name]);
        throw new Error(`${(error as Error).message}\n${logs.stdout}${logs.stderr}`);
      });

      // ...and keep alive with the manager over HTTPS: it lists them to its admin (the admin token of its Secret).
      const listed = async (what: string) => {
        const response = await request(`https://127.0.0.1:${ports.manager}/api/v1/${what}`, {
          headers: { authorization: `Bearer ${cluster.adminToken}` },
          dispatcher: cluster.agent,
        });
        assert.equal(response.statusCode, 200, `GET /api/v1/${what}`);
        return JSON.stringify(await response.body.json());
      };
      await waitFor(
        async () => {
          const peers = await listed('peers');
          return peers.includes('"kubeplay-node"') && peers.includes('"starling-seed-0"');
        },
        30_000,
        'the manager lists the peer and the seed',
      );
      assert.match(await listed('schedulers'), new RegExp(`127\\.0\\.0\\.1:${ports.scheduler}`), 'and the scheduler');

      const built = await buildImage({ layers: [{ sizeBytes: 6 * MiB, seed: 'kube-play' }] });
      const { ref } = await pushImage(built.layoutDir, built.tag, registry.host, 'app/kubeplay:v1');
      await containerd.pull(ref); // ctr checks every blob against its digest
      const layer = itemAt(built.layers, 0);
      // One copy in bytes (the seed reads the last piece on a request of its own), and none to containerd.
      assert.equal(blobBytesSent(registry.requests(), layer.digest), layer.size, 'the registry sent the layer once');
      for (const get of blobRequests(registry.requests(), layer.digest))
        assert.doesNotMatch(get.userAgent, /containerd/, 'to Starling, not to containerd');
      const stored = (await containerd.ctr(['content', 'get', layer.digest], { timeoutMs: 30_000 })).stdout;
      assert.ok(stored.length > 0);
      // The peer read the layer from the seed's upload port (TLS), not from the registry.
      const from = async (source: string) => scrapeMetric(`${mirror}/metrics`, 'starling_peer_downloaded_bytes_total', { source });
      assert.equal(await from('origin'), 0, 'the peer read nothing from the registry');
      assert.ok((await from('seed')) >= layer.size, `the peer's pieces came from the seed (${await from('seed')} bytes)`);
    });
  });
});

interface ClusterFiles {
  /** The default overlay rendered with the secret files an operator makes. */
  objects: any[];
  /** Each rendered Secret as a folder of its keys, by the name the manifests use (without kustomize's hash). */
  secrets: Record<string, string>;
  /** The cluster CA, and an undici dispatcher that trusts it without checking names (as components do). */
  ca: Buffer;
  agent: Agent;
  /** The console's first admin token. */
  adminToken: string;
}

/**
 * The default overlay rendered from a copy of deploy/kubernetes with its secret files made as the
 * README says: random tokens, and certificates written by the image's own `starling certs`.
 */
async function prepareCluster(dir: string, podman: (args: string[]) => Promise<RunResult>, image: string): Promise<ClusterFiles> {
  const copy = path.join(dir, 'deploy');
  await fsp.cp(DEPLOY, copy, { recursive: true });
  const adminToken = randomBytes(32).toString('base64');
  await fsp.writeFile(path.join(copy, 'base/secrets/cluster-token'), `${randomBytes(32).toString('base64')}\n`);
  await fsp.writeFile(path.join(copy, 'base/secrets/admin-token'), `${adminToken}\n`);
  const certs = path.join(copy, 'components/tls-files/secrets');
  const made = await podman(['run', '--rm', '--user', '0', ...ULIMITS, '-v', `${certs}:/out`, image, 'certs', '--out', '/out']);
  assert.equal(made.code, 0, `starling certs in the image: ${made.stderr}`);
  const result = await runOk('kubectl', ['kustomize', path.join(copy, 'overlays/default')]);
  const objects = parseAllDocuments(result.stdout).map((doc) => doc.toJSON());
  const secrets: Record<string, string> = {};
  for (const secret of objects.filter((o: any) => o.kind === 'Secret')) {
    const folder = path.join(dir, 'secrets', secret.metadata.name);
    await materializeSecret(secret, folder, IMAGE_USER.gid);
    secrets[secret.metadata.name] = folder;
    secrets[secret.metadata.name.replace(/-[a-z0-9]{10}$/, '')] = folder;
  }
  const ca = await fsp.readFile(path.join(certs, 'ca.crt'));
  return { objects, secrets, ca, agent: new Agent({ connect: { ca, checkServerIdentity: () => undefined } }), adminToken };
}

/**
 * A Secret as kubelet mounts it: a file per key, mode 0440 (the manifests' defaultMode), owned by
 * root with the non-root pods' fsGroup as group, so those read their key only through the group.
 */
async function materializeSecret(secret: any, folder: string, group: number): Promise<void> {
  await fsp.mkdir(folder, { recursive: true });
  for (const [key, value] of Object.entries(secret.data as Record<string, string>)) {
    const file = path.join(folder, key);
    await fsp.writeFile(file, Buffer.from(value, 'base64'));
    await fsp.chown(file, 0, group);
    await fsp.chmod(file, 0o440);
  }
}

interface PodPlan {
  name: string;
  image: string;
  /** Values kubelet would give the env vars that come from the downward API or a ConfigMap. */
  env: Record<string, string>;
  /** `--flag=value` in any container's args replaced: ports free here, test paths. */
  flags: Record<string, string>;
  /** Args added to a container, by its name. */
  extraArgs?: Record<string, string[]>;
  /** Service DNS names (with their port) and the 127.0.0.1 address that stands for them here. */
  services: Record<string, string>;
  /**
   * Host folders for the pod's volumes (hostPath, PVC, volumeClaimTemplates), by volume name; and
   * for an emptyDir that init containers fill, since each runs here as a pod of its own.
   */
  folders: Record<string, string>;
  /** Folders holding each Secret's keys, by Secret name. */
  secrets: Record<string, string>;
  /** The port the main container's probes reach here. */
  probePort: number;
}

/**
 * A workload's pod template as a Pod for `podman kube play`, changed only where one test machine
 * differs from a Kubernetes cluster: every pod on the host network (so that they reach each other
 * at 127.0.0.1), free ports instead of the fixed ones, Service names replaced by those addresses,
 * the downward API's values given, Secrets and volumes as host folders (mounted where the manifest
 * says), and $(VAR) in args expanded as kubelet does. Everything else — the args, the mounts, the
 * security contexts — is the manifest's.
 */
function podFromTemplate(workload: any, plan: PodPlan): any {
  const spec = structuredClone(workload.spec.template.spec);
  spec.hostNetwork = true;
  const folder = (name: string) => {
    const dir = plan.folders[name];
    assert.ok(dir, `${workload.metadata.name}: the test gives no folder for the volume ${name}`);
    return { name, hostPath: { path: dir, type: 'Directory' } };
  };
  spec.volumes = (spec.volumes ?? []).map((v: any) => {
    if (v.secret) {
      const dir = plan.secrets[v.secret.secretName];
      assert.ok(dir, `${workload.metadata.name}: no Secret ${v.secret.secretName} was rendered`);
      return { name: v.name, hostPath: { path: dir, type: 'Directory' } };
    }
    if (v.persistentVolumeClaim || v.hostPath || plan.folders[v.name]) return folder(v.name);
    return v;
  });
  for (const claim of workload.spec.volumeClaimTemplates ?? []) spec.volumes.push(folder(claim.metadata.name));
  const serviceNames = Object.keys(plan.services).sort((a, b) => b.length - a.length);
  for (const c of [...(spec.initContainers ?? []), ...spec.containers]) {
    c.image = plan.image;
    c.env = (c.env ?? []).map((e: any) => {
      if (!e.valueFrom) return e;
      assert.ok(plan.env[e.name] !== undefined, `${workload.metadata.name} ${c.name}: the test gives no value for ${e.name}`);
      return { name: e.name, value: plan.env[e.name] };
    });
    const values = Object.fromEntries(c.env.map((e: any) => [e.name, e.value]));
    c.args = [...(c.args ?? []), ...(plan.extraArgs?.[c.name] ?? [])].map((arg: string) => {
      const name = itemAt(arg.split('='), 0);
      let out = plan.flags[name] !== undefined ? `${name}=${plan.flags[name]}` : arg;
      for (const service of serviceNames) out = out.split(service).join(plan.services[service]);
      // kubelet expands $(VAR) in args from the container's env; podman does not.
      return out.replace(/\$\((\w+)\)/g, (whole, variable: string) => values[variable] ?? whole);
    });
    for (const probe of [c.readinessProbe, c.livenessProbe].filter(Boolean)) probe.httpGet.port = plan.probePort;
    // podman refuses port declarations on the host network (Kubernetes takes them as documentation there).
    delete c.ports;
  }
  return { apiVersion: 'v1', kind: 'Pod', metadata: { name: plan.name, labels: workload.spec.template.metadata.labels }, spec };
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
    res
      .writeHead(200, { 'content-type': 'application/json' })
      .end(JSON.stringify({ kind: 'Node', metadata: { name: node.name, labels: node.labels } }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return server;
}
