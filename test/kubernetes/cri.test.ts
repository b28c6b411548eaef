// The path kubelet really drives: containerd 1.6's CRI plugin, configured by `starling node-setup
// --lazy`, pulls through the Starling peer and mounts eStargz layers through the Starling
// snapshotter. A CRI client (gRPC runtime.v1) makes kubelet's calls: PullImage, RunPodSandbox on the
// host network with a locally built pause image, CreateContainer, StartContainer.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { startContainerd, type Containerd } from '../fixtures/containerd.js';
import { connectCri, type CriClient, type PodSpec } from '../fixtures/cri.js';
import { buildImage, imageInfo, pushImage } from '../fixtures/images.js';
import { startPeer, STARLING_CLI, type RunningPeerProcess } from '../fixtures/peer.js';
import { makeTempDir, run, runOk, type TempDir } from '../fixtures/processes.js';
import { blobBytesSent, blobRequests, startRegistry, type Registry } from '../fixtures/registry.js';
import { rangesRead, startRecordingProxy, type RecordingProxy } from '../fixtures/recording-proxy.js';
import { startSnapshotterProcess, type SnapshotterProcess } from '../fixtures/snapshotter.js';
import { itemAt } from '../../src/common/indexing.js';
import { pieceBounds, pieceLayout, pieceSizeFor, piecesCovering } from '../../src/storage/piece-plan.js';

const MiB = 1 << 20;
// The lazy layer's file: sixteen of the peer's 4 MiB pieces (pieceSizeFor), so the pieces around a
// few reads are a small part of it; the second layer stays smaller.
const BIG_FILE = 64 * MiB;
const SMALL_FILE = 10 * MiB;
const CREDS = { user: 'puller', password: 'cri-secret' };

describe('the CRI path on a node set up by starling node-setup --lazy', () => {
  let tmp: TempDir;
  let origin: Registry;
  let privateRegistry: Registry;
  let peer: RunningPeerProcess;
  let sn: SnapshotterProcess;
  /** Between the snapshotter and the peer: the reads the snapshotter made. */
  let reads: RecordingProxy;
  let containerd: Containerd;
  let cri: CriClient;
  let hostsDir: string;
  let pods = 0;
  const refs = { pause: '', plain: '', lazy: '', private: '' };
  let fileSums: Record<string, string>;

  before(async () => {
    tmp = await makeTempDir('starling-cri-');
    origin = await startRegistry();
    privateRegistry = await startRegistry({ htpasswd: CREDS });
    peer = await startPeer({ insecure: [origin.host, privateRegistry.host] });
    // Background fetch off: every byte the registry sends for a lazy layer is one a read asked for.
    reads = await startRecordingProxy(peer.url);
    sn = await startSnapshotterProcess({ dir: tmp.path, peerUrl: reads.url, configYaml: 'backgroundFetch:\n  enabled: false\n' });

    // The pause image every pod sandbox starts from (kubelet's sandbox_image), built here.
    const pause = await buildImage({ withBusybox: true, layers: [], cmd: ['sleep', '1000000000'] });
    refs.pause = (await pushImage(pause.layoutDir, pause.tag, origin.host, 'pause:3.9')).ref;
    const app = await buildImage({
      withBusybox: true,
      layers: [
        { sizeBytes: BIG_FILE, seed: 'cri-layer-0', files: { '/etc/one.txt': 'one\n' } },
        { sizeBytes: SMALL_FILE, seed: 'cri-layer-1', files: { '/etc/two.txt': 'two\n' } },
      ],
    });
    fileSums = {
      '/bin/busybox': createHash('sha256')
        .update(await fsp.readFile('/bin/busybox'))
        .digest('hex'),
      '/etc/one.txt': sha('one\n'),
      '/etc/two.txt': sha('two\n'),
      '/data/layer0.bin': itemAt(app.randomFiles, 0).sha256,
      '/etc/private.txt': sha('private\n'),
    };
    refs.plain = (await pushImage(app.layoutDir, app.tag, origin.host, 'app/plain:v1')).ref;
    // Its own layers: the peer already holds the public image's, and would not fetch them again.
    const secret = await buildImage({
      withBusybox: true,
      layers: [{ sizeBytes: 2 * MiB, seed: 'cri-private', files: { '/etc/private.txt': 'private\n' } }],
    });
    refs.private = (await pushImage(secret.layoutDir, secret.tag, privateRegistry.host, 'team/app:v1', { creds: CREDS })).ref;
    refs.lazy = `${origin.host}/app/lazy:esgz`;
    await runOk(process.execPath, [
      STARLING_CLI,
      'convert',
      refs.plain,
      refs.lazy,
      '--insecure-registry',
      origin.host,
      '--chunk-size',
      String(MiB),
    ]);

    containerd = await startContainerd({ cri: { sandboxImage: refs.pause } });
    hostsDir = path.join(tmp.path, 'certs.d');
    const setup = await run(process.execPath, [
      STARLING_CLI,
      'node-setup',
      '--containerd-config',
      containerd.configFile,
      '--hosts-dir',
      hostsDir,
      '--mirror',
      peer.url,
      '--insecure-registry',
      origin.host,
      '--insecure-registry',
      privateRegistry.host,
      '--lazy',
      '--snapshotter-socket',
      sn.socket,
      '--no-restart',
    ]);
    assert.equal(setup.code, 0, setup.stderr);
    assert.match(setup.stdout, /containerd config changed: restart containerd to apply it/);
    await containerd.restart();
    cri = connectCri(containerd.address);
  });

  after(async () => {
    cri?.close();
    await containerd?.stop();
    await sn?.stop();
    await reads?.close();
    await peer?.stop();
    await privateRegistry?.stop();
    await origin?.stop();
    await tmp?.remove();
  });

  test('the CRI plugin runs with what node-setup wrote: config_path, the starling snapshotter, snapshot annotations on', async () => {
    const version = await cri.version();
    assert.equal(version.runtimeName, 'containerd');
    const { config: configJson } = (await cri.status()).info;
    assert.ok(configJson, 'the runtime status carries the CRI plugin configuration (info.config)');
    const config = JSON.parse(configJson) as {
      registry: { configPath: string };
      containerd: { snapshotter: string; disableSnapshotAnnotations: boolean };
    };
    assert.equal(config.registry.configPath, hostsDir);
    assert.equal(config.containerd.snapshotter, 'starling');
    assert.equal(config.containerd.disableSnapshotAnnotations, false);
  });

  /** Runs `script` in a new host-network pod from `image`; returns the container's output. */
  async function runPod(image: string, script: string): Promise<string> {
    const pod: PodSpec = { name: `pod-${process.pid}-${++pods}`, logDirectory: path.join(tmp.path, 'pods', String(pods)) };
    const podId = await cri.runPodSandbox(pod);
    try {
      const containerId = await cri.startContainer(podId, pod, 'main', image, ['sh', '-c', script]);
      const status = await cri.waitExited(containerId);
      const output = await cri.readLog(status);
      assert.equal(status.exitCode, 0, `container exited ${status.exitCode} (${status.reason} ${status.message}): ${output}`);
      return output;
    } finally {
      await cri.removePod(podId);
    }
  }

  function checkSums(output: string, files: string[]): void {
    const got = Object.fromEntries(
      output
        .trim()
        .split('\n')
        .map((line) => line.split(/\s+/).reverse()),
    );
    for (const file of files) assert.equal(got[file], fileSums[file], `${file} read in the container`);
  }

  test("PullImage of an eStargz image is lazy: the registry sends at most the peer's pieces around the snapshotter's reads; the pod reads its files correctly", async () => {
    const layers = (await imageInfo(origin.host, 'app/lazy:esgz')).layers;
    await cri.pullImage(refs.lazy);
    const content = (await containerd.ctr(['content', 'ls', '-q'], { namespace: 'k8s.io' })).stdout;
    for (const [i, layer] of layers.entries()) {
      assert.ok(!content.includes(layer.digest), `layer ${i} was not downloaded into containerd's content store`);
      const fetched = await sn.metric('starling_snapshotter_layer_fetched_bytes', layer.digest);
      assert.ok(
        fetched > 0 && fetched < layer.size,
        `layer ${i}: the snapshotter fetched ${fetched} of ${layer.size} bytes through the peer`,
      );
    }
    const output = await runPod(refs.lazy, 'sha256sum /bin/busybox /etc/one.txt /etc/two.txt');
    checkSums(output, ['/bin/busybox', '/etc/one.txt', '/etc/two.txt']);
    // The origin sends only what is read: for each lazy layer, at most the peer's pieces that cover
    // the ranges the snapshotter asked it for, plus ranges the peer read again from the registry
    // because the piece stored for them was not verified yet (a read never gets unverified bytes).
    const reread = await peer.metric('starling_peer_unverified_range_bytes_total');
    const bounds = new Map<string, number>();
    for (const layer of layers) {
      const layout = pieceLayout(layer.size, pieceSizeFor(layer.size));
      const pieces = new Set<number>();
      for (const [start, end] of rangesRead(reads.requests, layer.digest, layer.size)) {
        const { first, last } = piecesCovering(layout, start, end);
        for (let i = first; i <= last; i++) pieces.add(i);
      }
      const bound = [...pieces].reduce((sum, i) => sum + pieceBounds(layout, i).length, 0) + reread;
      bounds.set(layer.digest, bound);
      const sent = blobBytesSent(origin.requests(), layer.digest);
      console.log(
        `# layer ${layer.digest.slice(7, 19)}: ${layer.size} B, ${layout.pieceCount} pieces, ${pieces.size} cover the snapshotter's reads; the registry sent ${sent} B (bound ${bound}, of which ${reread} read again)`,
      );
      assert.ok(sent > 0, `layer ${layer.digest}: the peer read the registry`);
      assert.ok(sent <= bound, `layer ${layer.digest}: the registry sent ${sent} B, more than the ${bound} B of pieces covering the reads`);
    }
    // The big layer was read for one small file: its bound is a small part of it.
    const big = layers.reduce((a, b) => (a.size > b.size ? a : b));
    assert.ok(big.size > BIG_FILE, `the big layer is ${big.size} B`);
    const bigBound = bounds.get(big.digest);
    assert.ok(bigBound !== undefined, `a bound for the big layer ${big.digest}`);
    assert.ok(bigBound <= big.size / 4, `the bound ${bigBound} B of the ${big.size} B layer`);
    // The pause image came through the mirror too: its layer's only GET is the peer's.
    assert.ok((await peer.metric('starling_peer_downloaded_bytes_total', { source: 'origin' })) > 0);
  });

  test("a plain (not eStargz) image pulls through the mirror: one copy from the registry, the peer's", async () => {
    const mark = origin.requests().length;
    await cri.pullImage(refs.plain);
    // Layer 0 (busybox) is the pause image's too: containerd has it already.
    const [, ...layers] = (await imageInfo(origin.host, 'app/plain:v1')).layers;
    for (const layer of layers) {
      const gets = blobRequests(origin.requests().slice(mark), layer.digest);
      assert.equal(gets.length, 1, `one GET of ${layer.digest}`);
      assert.doesNotMatch(itemAt(gets, 0).userAgent, /containerd/, 'made by the peer, not by containerd');
    }
    checkSums(await runPod(refs.plain, 'sha256sum /data/layer0.bin /etc/one.txt'), ['/data/layer0.bin', '/etc/one.txt']);
  });

  test('PullImage with credentials (what an imagePullSecret becomes) reaches the private registry through the mirror', async () => {
    await assert.rejects(cri.pullImage(refs.private), /401|unauthorized|authorization/i, 'no credentials, no image');
    await cri.pullImage(refs.private, { username: CREDS.user, password: CREDS.password });
    const [, ...layers] = (await imageInfo(privateRegistry.host, 'team/app:v1', { creds: CREDS })).layers;
    for (const layer of layers) {
      const gets = blobRequests(privateRegistry.requests(), layer.digest).filter((r) => r.status === 200);
      assert.equal(gets.length, 1, `one GET of ${layer.digest}`);
      assert.doesNotMatch(itemAt(gets, 0).userAgent, /containerd/, 'made by the peer, not by containerd');
    }
    checkSums(await runPod(refs.private, 'sha256sum /etc/private.txt'), ['/etc/private.txt']);
  });
});

function sha(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}
