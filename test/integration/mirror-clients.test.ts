// Real clients through the peer mirror: containerd 1.6 (ctr pull + run, configured by
// `starling containerd-config`), skopeo and podman; the registry's own log is the witness.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { podmanPullViaMirror, skopeoCopyViaMirror } from '../fixtures/clients.js';
import { startContainerd, type Containerd } from '../fixtures/containerd.js';
import { buildImage, pushImage, type BuiltImage } from '../fixtures/images.js';
import { STARLING_CLI, startPeer, type RunningPeerProcess } from '../fixtures/peer.js';
import { makeTempDir, runOk, waitFor, type TempDir } from '../fixtures/processes.js';
import { blobRequests, startRegistry, type Registry } from '../fixtures/registry.js';

const MiB = 1024 * 1024;

describe('peer mirror: containerd, skopeo and podman pull through it', { timeout: 600_000 }, () => {
  let registry: Registry;
  let peer: RunningPeerProcess;
  let image: BuiltImage;
  let work: TempDir;
  const ref = 'apps/tool:v1';

  before(async () => {
    work = await makeTempDir('starling-clients-');
    [registry, image] = await Promise.all([
      startRegistry(),
      buildImage({
        withBusybox: true,
        layers: [
          { sizeBytes: 6 * MiB, seed: 'clients-layer-1', files: { '/etc/motd': 'pulled through starling\n' } },
          { sizeBytes: 9 * MiB, seed: 'clients-layer-2' },
        ],
      }),
    ]);
    await pushImage(image.layoutDir, image.tag, registry.host, ref);
    // skopeo and podman send no ?ns=: the default registry names their upstream.
    peer = await startPeer({ insecure: [registry.host], registryDefault: `http://${registry.host}` });
  });
  after(async () => {
    await peer?.stop();
    await registry?.stop();
    await work?.remove();
  });

  const layerDigests = () => image.layers.map((layer) => layer.digest);
  const blobGets = () => blobRequests(registry.requests()).filter((r) => layerDigests().some((d) => r.uri.includes(d)));
  const checksumCommand = () => ['sh', '-c', `cat /etc/motd; sha256sum ${image.randomFiles.map((f) => f.path).join(' ')}`];
  const assertChecksums = (stdout: string) => {
    assert.match(stdout, /pulled through starling/);
    for (const file of image.randomFiles) assert.match(stdout, new RegExp(`${file.sha256}\\s+${file.path}`));
  };

  it('containerd pulls through the mirror and runs; a second containerd makes the registry send no blob', async () => {
    const hostsDir = `${work.path}/hosts.d`;
    const configured = await runOk(process.execPath, [
      STARLING_CLI,
      'containerd-config',
      '--hosts-dir',
      hostsDir,
      '--mirror',
      peer.url,
      '--insecure-registry',
      registry.host,
    ]);
    assert.match(configured.stdout, new RegExp(`wrote ${hostsDir}/${registry.host.replace('.', '\\.')}/hosts.toml`));

    const first: Containerd = await startContainerd({ hostsDir });
    try {
      await first.pull(`${registry.host}/${ref}`);
      const ran = await first.runContainer(`${registry.host}/${ref}`, checksumCommand());
      assert.equal(ran.code, 0, ran.stderr);
      assertChecksums(ran.stdout);
    } finally {
      await first.stop();
    }
    await waitFor(() => blobGets().length >= image.layers.length, 5000, 'registry access log');
    const sentAfterFirst = blobGets().length;
    assert.equal(sentAfterFirst, image.layers.length, 'each layer left the registry once');
    assert.equal((await peer.metric('starling_peer_blob_requests_total', { cache: 'miss' })) >= image.layers.length, true);

    const second: Containerd = await startContainerd({ hostsDir });
    try {
      await second.pull(`${registry.host}/${ref}`);
      const ran = await second.runContainer(`${registry.host}/${ref}`, checksumCommand());
      assert.equal(ran.code, 0, ran.stderr);
      assertChecksums(ran.stdout);
    } finally {
      await second.stop();
    }
    assert.equal(blobGets().length, sentAfterFirst, 'the second containerd caused no blob request at the registry');
    assert.ok((await peer.metric('starling_peer_blob_requests_total', { cache: 'hit' })) >= image.layers.length);
  });

  it('skopeo copies through the mirror from the cache', async () => {
    const before = blobGets().length;
    const { result } = await skopeoCopyViaMirror({
      registryHost: registry.host,
      mirrorHost: peer.host,
      ref,
      destDir: `${work.path}/skopeo-layout`,
    });
    assert.equal(result.code, 0);
    assert.equal(blobGets().length, before, 'layers came from the peer, not the registry');
  });

  it('podman pulls through the mirror and runs the image', async () => {
    const before = blobGets().length;
    const { run } = await podmanPullViaMirror({
      registryHost: registry.host,
      mirrorHost: peer.host,
      ref,
      cmd: checksumCommand(),
    });
    assert.ok(run, 'podman ran the command');
    assertChecksums(run.stdout);
    assert.equal(blobGets().length, before, 'layers came from the peer, not the registry');
  });
});
