// The whole system end to end: manager, scheduler, seed and peers as separate processes with a
// cluster token. The scheduler and peers learn about each other through the manager; a preheat
// job puts an image's layers on the seed; after it, pulls through the peers cause no blob
// request at the registry.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { after, before, describe, it } from 'node:test';
import { request } from 'undici';
import { buildImage, pushImage, type BuiltImage } from '../fixtures/images.js';
import { STARLING_CLI, startPeer, startScheduler, type RunningPeerProcess } from '../fixtures/peer.js';
import { freePort, makeTempDir, spawnService, waitFor, waitForHttp, type Service, type TempDir } from '../fixtures/processes.js';
import { blobRequests, startRegistry, type Registry } from '../fixtures/registry.js';

const MiB = 1024 * 1024;

describe('manager, scheduler and peers together: preheat', { timeout: 300_000 }, () => {
  let registry: Registry;
  let image: BuiltImage;
  let work: TempDir;
  let manager: Service;
  let managerUrl: string;
  const adminToken = `admin-${randomBytes(12).toString('hex')}`;
  const stops: Array<() => Promise<unknown>> = [];
  const ref = 'preheat/app:v1';

  const api = async (method: 'GET' | 'POST', path: string, body?: unknown) => {
    const response = await request(`${managerUrl}${path}`, {
      method,
      headers: { authorization: `Bearer ${adminToken}`, ...(body ? { 'content-type': 'application/json' } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    });
    return { status: response.statusCode, body: (await response.body.json()) as any };
  };

  before(async () => {
    work = await makeTempDir('starling-preheat-');
    [registry, image] = await Promise.all([
      startRegistry(),
      buildImage({ withBusybox: true, layers: [{ sizeBytes: 12 * MiB, seed: 'preheat-layer' }] }),
    ]);
    await pushImage(image.layoutDir, image.tag, registry.host, ref);
    const clusterToken = `${work.path}/cluster.token`;
    await writeFile(clusterToken, randomBytes(24).toString('hex'));
    await writeFile(`${work.path}/admin.token`, adminToken);
    const port = await freePort('127.0.0.100');
    managerUrl = `http://127.0.0.100:${port}`;
    manager = await spawnService({
      cmd: process.execPath,
      args: [STARLING_CLI, 'manager', '--listen', `127.0.0.100:${port}`, '--data-dir', `${work.path}/manager`,
        '--cluster-token-file', clusterToken, '--admin-token-file', `${work.path}/admin.token`, '--insecure-registry', registry.host],
      name: 'starling-manager',
    });
    stops.push(() => manager.stop());
    await waitForHttp(`${managerUrl}/healthz`, 20_000, manager);
    const scheduler = await startScheduler({ ip: '127.0.0.101', clusterTokenFile: clusterToken, extraArgs: ['--manager', managerUrl] });
    stops.push(() => scheduler.stop());
    // Peers name only the manager: the scheduler comes from it.
    const peerArgs = ['--manager', managerUrl];
    const seed = await startPeer({ ip: '127.0.0.102', insecure: [registry.host], extraArgs: [...peerArgs, '--seed', '--upload-listen', '127.0.0.102:0', '--cluster-token-file', clusterToken] });
    stops.push(() => seed.stop());
    const nodes: RunningPeerProcess[] = [];
    for (const ip of ['127.0.0.103', '127.0.0.104']) {
      const peer = await startPeer({ ip, insecure: [registry.host], extraArgs: [...peerArgs, '--upload-listen', `${ip}:0`, '--cluster-token-file', clusterToken] });
      stops.push(() => peer.stop());
      nodes.push(peer);
    }
    (globalThis as any).__nodes = nodes;
  });
  after(async () => {
    for (const stop of stops.reverse()) await stop().catch(() => undefined);
    await registry?.stop();
    await work?.remove();
  });

  it('registers everyone, runs a preheat to the seeds, and then pulls cause no registry blob request', async () => {
    const nodes = (globalThis as any).__nodes as RunningPeerProcess[];
    await waitFor(async () => (await api('GET', '/api/v1/peers')).body.length === 3, 20_000, 'three peers registered');
    const schedulers = (await api('GET', '/api/v1/schedulers')).body as Array<{ state: string }>;
    assert.equal(schedulers.filter((s) => s.state === 'active').length, 1);

    const created = await api('POST', '/api/v1/jobs', { type: 'preheat', image: `${registry.host}/${ref}`, platform: 'linux/amd64', scope: 'seeds' });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    const jobId = created.body.id;
    let job: any;
    await waitFor(async () => {
      job = (await api('GET', `/api/v1/jobs/${jobId}`)).body;
      return job.state === 'succeeded' || job.state === 'failed';
    }, 60_000, 'preheat job to finish');
    assert.equal(job.state, 'succeeded', JSON.stringify(job));
    const gets = () => image.layers.reduce((sum, layer) => sum + blobRequests(registry.requests(), layer.digest).length, 0);
    await waitFor(() => gets() >= image.layers.length, 5000, 'registry access log');
    const afterPreheat = gets();

    for (const peer of nodes) {
      for (const layer of image.layers) {
        const response = await request(`${peer.url}/v2/preheat/app/blobs/${layer.digest}?ns=${registry.host}`);
        const hash = createHash('sha256');
        for await (const chunk of response.body) hash.update(chunk);
        assert.equal(`sha256:${hash.digest('hex')}`, layer.digest);
      }
    }
    assert.equal(gets(), afterPreheat, 'after the preheat, pulls made no blob request at the registry');

    const unknown = await api('POST', '/api/v1/jobs', { type: 'preheat', image: `${registry.host}/preheat/nothing:v9`, scope: 'seeds' });
    assert.ok(unknown.status >= 400 && unknown.status < 500, JSON.stringify(unknown.body));
    assert.match(JSON.stringify(unknown.body), /not_found|not found/i);
  });
});
