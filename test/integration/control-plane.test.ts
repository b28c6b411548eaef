// The whole system end to end, as separate processes with a cluster token: a manager, two
// schedulers, one seed and four peers, each peer the mirror of its own containerd. Schedulers
// and peers find each other through the manager. Proves: after a preheat, four containerd pulls
// make no blob request at the registry; a scheduler killed mid-pull loses no pull.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { after, before, describe, it } from 'node:test';
import { request } from 'undici';
import { startContainerd, type Containerd } from '../fixtures/containerd.js';
import { buildImage, pushImage, type BuiltImage } from '../fixtures/images.js';
import {
  scrapeMetric,
  STARLING_CLI,
  startPeer,
  startScheduler,
  type RunningPeerProcess,
  type RunningSchedulerProcess,
} from '../fixtures/peer.js';
import { freePort, makeTempDir, runOk, spawnService, waitFor, waitForHttp, type Service, type TempDir } from '../fixtures/processes.js';
import { blobBytesSent, blobRequests, startRegistry, type Registry } from '../fixtures/registry.js';

const MiB = 1024 * 1024;
/** Upload cap on every peer, so the second pull lasts long enough to lose a scheduler in it. */
const UPLOAD_LIMIT = '6MB';

interface Node {
  peer: RunningPeerProcess;
  containerd: Containerd;
}

describe('manager, two schedulers, a seed and four containerd nodes', { timeout: 600_000 }, () => {
  let registry: Registry;
  let preheated: BuiltImage;
  let streamed: BuiltImage;
  let work: TempDir;
  let manager: Service;
  let managerUrl: string;
  const schedulers: RunningSchedulerProcess[] = [];
  const nodes: Node[] = [];
  const adminToken = `admin-${randomBytes(12).toString('hex')}`;
  const stops: Array<() => Promise<unknown>> = [];

  const api = async (method: 'GET' | 'POST', path: string, body?: unknown) => {
    const response = await request(`${managerUrl}${path}`, {
      method,
      headers: { authorization: `Bearer ${adminToken}`, ...(body ? { 'content-type': 'application/json' } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    });
    return { status: response.statusCode, body: (await response.body.json()) as any };
  };

  /** Every blob GET the registry served for these digests. */
  const blobGets = (digests: string[]) => digests.reduce((sum, digest) => sum + blobRequests(registry.requests(), digest).length, 0);

  /** Pulls `ref` on every node at once, then runs sha256sum over the image's random files in each. */
  const pullAndCheckEverywhere = async (ref: string, image: BuiltImage, onPulling?: () => Promise<void>) => {
    const pulls = Promise.all(
      nodes.map(async ({ containerd }) => {
        await containerd.pull(ref);
        return containerd.runContainer(ref, ['sha256sum', ...image.randomFiles.map((f) => f.path)]);
      }),
    );
    await onPulling?.();
    for (const ran of await pulls) {
      assert.equal(ran.code, 0, ran.stderr);
      for (const file of image.randomFiles) assert.match(ran.stdout, new RegExp(`${file.sha256}  ${file.path}`));
    }
  };

  before(async () => {
    work = await makeTempDir('starling-control-plane-');
    [registry, preheated, streamed] = await Promise.all([
      startRegistry(),
      buildImage({ withBusybox: true, layers: [{ sizeBytes: 12 * MiB, seed: 'control-plane-preheat' }] }),
      buildImage({ withBusybox: true, layers: [{ sizeBytes: 40 * MiB, seed: 'control-plane-streamed' }] }),
    ]);
    await pushImage(preheated.layoutDir, preheated.tag, registry.host, 'cp/preheated:v1');
    await pushImage(streamed.layoutDir, streamed.tag, registry.host, 'cp/streamed:v1');
    const clusterToken = `${work.path}/cluster.token`;
    await writeFile(clusterToken, randomBytes(24).toString('hex'));
    await writeFile(`${work.path}/admin.token`, adminToken);

    const port = await freePort('127.0.0.100');
    managerUrl = `http://127.0.0.100:${port}`;
    manager = await spawnService({
      cmd: process.execPath,
      args: [
        STARLING_CLI,
        'manager',
        '--listen',
        `127.0.0.100:${port}`,
        '--data-dir',
        `${work.path}/manager`,
        '--cluster-token-file',
        clusterToken,
        '--admin-token-file',
        `${work.path}/admin.token`,
        '--insecure-registry',
        registry.host,
      ],
      name: 'starling-manager',
    });
    stops.push(() => manager.stop());
    await waitForHttp(`${managerUrl}/healthz`, 20_000, manager);

    for (const ip of ['127.0.0.101', '127.0.0.105']) {
      const scheduler = await startScheduler({ ip, clusterTokenFile: clusterToken, extraArgs: ['--manager', managerUrl] });
      stops.push(() => scheduler.stop());
      schedulers.push(scheduler);
    }
    // Peers ask the manager for schedulers on their first keep-alive: both must be registered by then.
    await waitFor(
      async () => (await api('GET', '/api/v1/schedulers')).body.filter((s: any) => s.state === 'active').length === 2,
      20_000,
      'two active schedulers',
    );

    const swarmArgs = (ip: string) => [
      '--manager',
      managerUrl,
      '--upload-listen',
      `${ip}:0`,
      '--cluster-token-file',
      clusterToken,
      '--upload-rate-limit',
      UPLOAD_LIMIT,
    ];
    const seed = await startPeer({ ip: '127.0.0.102', insecure: [registry.host], extraArgs: [...swarmArgs('127.0.0.102'), '--seed'] });
    stops.push(() => seed.stop());
    for (const [i, ip] of ['127.0.0.103', '127.0.0.104', '127.0.0.106', '127.0.0.107'].entries()) {
      const peer = await startPeer({ ip, insecure: [registry.host], extraArgs: swarmArgs(ip) });
      stops.push(() => peer.stop());
      const hostsDir = `${work.path}/hosts-${i}`;
      await runOk(process.execPath, [
        STARLING_CLI,
        'containerd-config',
        '--hosts-dir',
        hostsDir,
        '--mirror',
        peer.url,
        '--insecure-registry',
        registry.host,
      ]);
      const containerd = await startContainerd({ hostsDir });
      stops.push(() => containerd.stop());
      nodes.push({ peer, containerd });
    }
  });
  after(async () => {
    for (const stop of stops.reverse()) await stop().catch(() => undefined);
    await registry?.stop();
    await work?.remove();
  });

  it('a preheat to the seed, then four containerd pulls: zero blob requests at the registry', async () => {
    await waitFor(async () => (await api('GET', '/api/v1/peers')).body.length === 5, 20_000, 'five peers registered');
    const ref = `${registry.host}/cp/preheated:v1`;
    const created = await api('POST', '/api/v1/jobs', { type: 'preheat', image: ref, platform: 'linux/amd64', scope: 'seeds' });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    let job: any;
    await waitFor(
      async () => {
        job = (await api('GET', `/api/v1/jobs/${created.body.id}`)).body;
        return job.state === 'succeeded' || job.state === 'failed';
      },
      120_000,
      'preheat job to finish',
    );
    assert.equal(job.state, 'succeeded', JSON.stringify(job));
    // The layers and the config: everything a pull reads besides the manifest.
    const digests: string[] = job.layers.map((l: { digest: string }) => l.digest);
    assert.equal(digests.length, preheated.layers.length + 1);
    for (const layer of preheated.layers) assert.ok(digests.includes(layer.digest), `layer ${layer.digest} preheated`);
    await waitFor(() => blobGets(digests) >= digests.length, 5000, 'registry access log');
    const afterPreheat = blobGets(digests);

    await pullAndCheckEverywhere(ref, preheated);
    assert.equal(blobGets(digests), afterPreheat, 'four containerd pulls after the preheat made no blob request at the registry');
    const fromOrigin = await Promise.all(
      nodes.map(({ peer }) => peer.metric('starling_peer_downloaded_bytes_total', { source: 'origin' })),
    );
    assert.deepEqual(fromOrigin, [0, 0, 0, 0], 'the nodes read nothing from the origin');

    const unknown = await api('POST', '/api/v1/jobs', { type: 'preheat', image: `${registry.host}/cp/nothing:v9`, scope: 'seeds' });
    assert.ok(unknown.status >= 400 && unknown.status < 500, JSON.stringify(unknown.body));
    assert.match(JSON.stringify(unknown.body), /not_found|not found/i);
  });

  it('the scheduler holding the task is killed mid-pull: every pull completes with correct data', async () => {
    const ref = `${registry.host}/cp/streamed:v1`;
    const big = streamed.layers.reduce((a, b) => (b.size > a.size ? b : a));
    let killed: RunningSchedulerProcess | undefined;
    let bytesAtKill = 0;
    await pullAndCheckEverywhere(ref, streamed, async () => {
      // Wait until the big layer is flowing through the swarm, then kill the scheduler that has it.
      const holder = async () => {
        for (const scheduler of schedulers) {
          const response = await scheduler.task(big.digest);
          await response.body.dump();
          if (response.statusCode === 200) return scheduler;
        }
        return undefined;
      };
      const received = async () =>
        (await Promise.all(nodes.map(({ peer }) => peer.metric('starling_peer_downloaded_bytes_total')))).reduce((a, b) => a + b, 0);
      await waitFor(async () => (await holder()) !== undefined && (await received()) > 4 * MiB, 60_000, 'the big layer flowing');
      const found = await holder();
      assert.ok(found, 'a scheduler holds the task');
      killed = found;
      bytesAtKill = await received();
      await killed.service.kill9();
    });
    assert.ok(killed, 'a scheduler was killed');
    const survivor = schedulers.find((s) => s !== killed);
    assert.ok(survivor, 'another scheduler is left');
    const total = big.size * nodes.length;
    console.log(
      `# killed ${killed.address} with ${(bytesAtKill / MiB).toFixed(1)} of ${(total / MiB).toFixed(0)} MiB received by the nodes`,
    );
    // The task moved: the surviving scheduler knows it now.
    const moved = await survivor.task(big.digest);
    await moved.body.dump();
    assert.equal(moved.statusCode, 200, 'the surviving scheduler took the task over');
    const copies = blobBytesSent(registry.requests(), big.digest) / big.size;
    console.log(
      `# registry sent ${copies.toFixed(2)} copies of the ${(big.size / MiB).toFixed(0)} MiB layer to ${nodes.length} nodes and a seed`,
    );
    assert.ok(
      copies < nodes.length,
      `the swarm kept working after the kill: the registry sent ${copies.toFixed(2)} copies, fewer than one per node`,
    );
    const peerBytes = await scrapeMetric(survivor.metricsUrl, 'starling_scheduler_bytes_total', { source: 'peer' });
    console.log(`# bytes between peers reported to the surviving scheduler: ${(peerBytes / MiB).toFixed(1)} MiB`);
  });
});
