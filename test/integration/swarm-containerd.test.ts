// Two containerd instances, each pulling through its own Starling peer in one swarm:
// the registry sends each layer once.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { startContainerd } from '../fixtures/containerd.js';
import { buildImage, pushImage, type BuiltImage } from '../fixtures/images.js';
import { STARLING_CLI, startPeer, startScheduler, type RunningPeerProcess } from '../fixtures/peer.js';
import { makeTempDir, runOk, waitFor, type TempDir } from '../fixtures/processes.js';
import { blobBytesSent, startRegistry, type Registry } from '../fixtures/registry.js';

const MiB = 1024 * 1024;

describe('swarm: containerd pulls through peers', { timeout: 300_000 }, () => {
  let registry: Registry;
  let image: BuiltImage;
  let work: TempDir;
  const stops: Array<() => Promise<void>> = [];
  const ref = 'swarm/app:v1';

  before(async () => {
    work = await makeTempDir('starling-swarm-ctr-');
    [registry, image] = await Promise.all([
      startRegistry(),
      buildImage({
        withBusybox: true,
        layers: [
          { sizeBytes: 24 * MiB, seed: 'swarm-ctr-1' },
          { sizeBytes: 12 * MiB, seed: 'swarm-ctr-2' },
        ],
      }),
    ]);
    await pushImage(image.layoutDir, image.tag, registry.host, ref);
  });
  after(async () => {
    for (const stop of stops.reverse()) await stop().catch(() => undefined);
    await registry?.stop();
    await work?.remove();
  });

  it('two containerd, two peers, one seed: each layer leaves the registry once and both containers run', async () => {
    const scheduler = await startScheduler({ ip: '127.0.0.90' });
    stops.push(() => scheduler.stop());
    const seed = await startPeer({ ip: '127.0.0.91', schedulers: [scheduler.address], seed: true, insecure: [registry.host] });
    stops.push(() => seed.stop());
    const nodes: RunningPeerProcess[] = [];
    for (const ip of ['127.0.0.92', '127.0.0.93']) {
      const peer = await startPeer({ ip, schedulers: [scheduler.address], insecure: [registry.host] });
      stops.push(() => peer.stop());
      nodes.push(peer);
    }
    const runs = await Promise.all(
      nodes.map(async (peer, i) => {
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
        await containerd.pull(`${registry.host}/${ref}`);
        return containerd.runContainer(`${registry.host}/${ref}`, ['sha256sum', ...image.randomFiles.map((f) => f.path)]);
      }),
    );
    for (const ran of runs) {
      assert.equal(ran.code, 0, ran.stderr);
      for (const file of image.randomFiles) assert.match(ran.stdout, new RegExp(file.sha256));
    }
    // One copy of each layer, in bytes: a seed reads a blob's last piece on its own request.
    for (const layer of image.layers) {
      const sent = () => blobBytesSent(registry.requests(), layer.digest);
      await waitFor(() => sent() >= layer.size, 5000, `the registry's log of ${layer.digest}`).catch(() => undefined);
      assert.equal(sent(), layer.size, `layer ${layer.digest} left the registry ${(sent() / layer.size).toFixed(2)} times`);
    }
    const fromOrigin = await Promise.all(nodes.map((peer) => peer.metric('starling_peer_downloaded_bytes_total', { source: 'origin' })));
    assert.deepEqual(fromOrigin, [0, 0], 'the nodes got every layer from the swarm');
  });
});
