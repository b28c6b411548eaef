// The seed experiment at test size, end to end (bench/e2e-cluster.ts runs it at full size): two
// emulated nodes, each with its own containerd, Starling peer and Starling snapshotter in its own
// network namespace, a docker-registry behind a capped link, a scheduler and a seed. Every row must
// start the workload on every node (its ready line, checked against the one it printed when the image
// was optimized) and count what the registry sent.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { busyboxModelImage, type WorkloadImage } from '../../bench/lib/e2e-image.js';
import { runRow, startE2eCluster, type E2eContext, type RowResult } from '../../bench/lib/e2e-rows.js';
import { makeTempDir, type TempDir } from '../fixtures/processes.js';

const MiB = 1 << 20;
const NODES = 2;

describe('the seed experiment end to end, 2 nodes', { timeout: 600_000 }, () => {
  let work: TempDir;
  let image: WorkloadImage;
  let context: Awaited<ReturnType<typeof startE2eCluster>>;
  const ctx = (): E2eContext => ({ ...context, wholeImageTimeoutMs: 120_000 });

  before(async () => {
    // busybox, 8 shards of 2 MiB (the workload loads 2), an app layer: built once, cached in /var/tmp.
    image = await busyboxModelImage({ modelBytes: 16 * MiB, shardBytes: 2 * MiB, shardsLoaded: 2 });
    work = await makeTempDir('starling-e2e-');
    context = await startE2eCluster(image, { nodes: NODES, nodeRate: '100mbit', originRate: '100mbit', workDir: work.path });
  });

  after(async () => {
    await context?.stop();
    await work?.remove();
  });

  const everyNodeReady = (r: RowResult) => {
    assert.equal(r.nodes.length, NODES);
    // The pulls wait at one start gate (armGated): each began within moments of its opening.
    assert.ok(
      r.startSpreadSeconds >= 0 && r.startSpreadSeconds < 2,
      `the pulls began up to ${r.startSpreadSeconds} s after the gate opened`,
    );
    for (const node of r.nodes)
      assert.ok(node.readySeconds > 0 && node.readySeconds >= node.pulledSeconds, `${node.node}: ${JSON.stringify(node)}`);
  };

  test('(a) direct pulls: every node runs the workload, and the registry sends one copy per node', async () => {
    const r = await runRow(ctx(), 'a');
    everyNodeReady(r);
    assert.ok(r.registryCopies > NODES * 0.99 && r.registryCopies < NODES * 1.05, `registry sent ${r.registryCopies} copies of the image`);
  });

  test('(b) through the swarm: every node runs the workload from the whole image, and the registry sends one copy', async () => {
    const r = await runRow(ctx(), 'b');
    everyNodeReady(r);
    assert.ok(r.registryCopies > 0.99 && r.registryCopies < 1.05, `registry sent ${r.registryCopies} copies of the image`);
    for (const [i, read] of r.readBytesPerNode.entries())
      assert.ok(read >= image.plain.bytes, `n${i} received ${read} B of a ${image.plain.bytes} B image`);
  });

  test('(c) lazily through the snapshotter and the swarm, no background fetch: every node runs the workload having received only part of the image', async () => {
    const r = await runRow(ctx(), 'c-no-bg');
    everyNodeReady(r);
    for (const [i, read] of r.readBytesPerNode.entries())
      assert.ok(read < 0.75 * image.lazy.bytes, `n${i} received ${read} B of a ${image.lazy.bytes} B image`);
  });

  test('(c) with background fetch: every node runs the workload, then holds the whole image, and the registry sends one copy in all', async () => {
    const r = await runRow(ctx(), 'c');
    everyNodeReady(r);
    assert.ok(r.lastWholeImageSeconds !== undefined && r.lastWholeImageSeconds >= r.lastSeconds, 'every node then held the whole image');
    assert.ok(
      r.registryBytesTotal > 0.99 * image.lazy.bytes && r.registryBytesTotal < 1.05 * image.lazy.bytes,
      `the registry sent ${r.registryBytesTotal} B of a ${image.lazy.bytes} B image`,
    );
  });

  test('(d) lazily from the registry, without the swarm: every node runs the workload, and the registry serves every node the whole image', async () => {
    const r = await runRow(ctx(), 'd');
    everyNodeReady(r);
    assert.ok(r.lastWholeImageSeconds !== undefined, 'every node then held the whole image');
    assert.ok(
      r.registryBytesTotal > 0.99 * NODES * image.lazy.bytes,
      `the registry sent ${r.registryBytesTotal} B for ${NODES} nodes of a ${image.lazy.bytes} B image`,
    );
  });
});
