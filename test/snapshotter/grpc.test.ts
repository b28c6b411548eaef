// The snapshots.v1 service of a real `starling snapshotter` process, driven over its unix socket
// with grpc-js: ordinary overlay snapshots, errors as containerd expects them, labels, filters,
// usage, Remove/Cleanup, metadata across a restart, and the fallback when a remote mount fails.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { status } from '@grpc/grpc-js';
import { after, before, describe, test } from 'node:test';
import { startSnapshotterProcess, type SnapshotterProcess } from '../fixtures/snapshotter.js';
import { call, list, snapshotsClient, type SnapshotsClient } from './helpers.js';
import { makeTempDir, type TempDir } from '../fixtures/processes.js';

const D = (c: string) => `sha256:${c.repeat(64)}`;

describe('snapshots.v1 over the unix socket', () => {
  let tmp: TempDir;
  let sn: SnapshotterProcess;
  let client: SnapshotsClient;
  const snapDir = (id: string) => path.join(sn.root, 'snapshots', id);
  const idOf = (mount: { source: string; options: string[] }) => {
    const p = mount.options.find((o) => o.startsWith('upperdir='))?.slice(9) ?? mount.source;
    return path.basename(path.dirname(p));
  };

  before(async () => {
    tmp = await makeTempDir('starling-sn-grpc-');
    // No peer listens on port 9: a remote Prepare must fall back to an ordinary snapshot.
    sn = await startSnapshotterProcess({ dir: tmp.path, peerUrl: 'http://127.0.0.1:9' });
    client = snapshotsClient(sn.socket);
  });

  after(async () => {
    client?.close();
    await sn?.stop();
    await tmp?.remove();
  });

  test('a chain of overlay snapshots: bind without parent, overlay lowerdirs nearest first, views', async () => {
    const base = await call(client, 'Prepare', { key: 'base-active', parent: '', labels: {} });
    assert.equal(base.mounts.length, 1);
    assert.equal(base.mounts[0].type, 'bind');
    assert.deepEqual(base.mounts[0].options, ['rw', 'rbind']);
    const baseId = idOf(base.mounts[0]);
    fs.writeFileSync(path.join(base.mounts[0].source, 'hello'), 'x'.repeat(10_000));
    await call(client, 'Commit', { name: 'base', key: 'base-active', labels: { layer: 'one' } });
    await assert.rejects(call(client, 'Stat', { key: 'base-active' }), { code: status.NOT_FOUND });
    const stat = await call(client, 'Stat', { key: 'base' });
    assert.equal(stat.info.kind, 'COMMITTED');
    assert.equal(stat.info.labels.layer, 'one');
    assert.ok(stat.info.createdAt.seconds > 1_600_000_000);

    const mid = await call(client, 'Prepare', { key: 'mid-active', parent: 'base' });
    assert.equal(mid.mounts[0].type, 'overlay');
    const midId = idOf(mid.mounts[0]);
    assert.deepEqual(mid.mounts[0].options, [
      `workdir=${snapDir(midId)}/work`,
      `upperdir=${snapDir(midId)}/fs`,
      `lowerdir=${snapDir(baseId)}/fs`,
    ]);
    await call(client, 'Commit', { name: 'mid', key: 'mid-active' });

    const top = await call(client, 'Prepare', { key: 'container', parent: 'mid' });
    assert.match(top.mounts[0].options.at(-1), new RegExp(`^lowerdir=${snapDir(midId)}/fs:${snapDir(baseId)}/fs$`));
    assert.deepEqual((await call(client, 'Mounts', { key: 'container' })).mounts, top.mounts);

    const view1 = await call(client, 'View', { key: 'view-1', parent: 'base' });
    assert.deepEqual(view1.mounts[0], { type: 'bind', source: `${snapDir(baseId)}/fs`, target: '', options: ['ro', 'rbind'] });
    const view2 = await call(client, 'View', { key: 'view-2', parent: 'mid' });
    assert.deepEqual(view2.mounts[0].options, [`lowerdir=${snapDir(midId)}/fs:${snapDir(baseId)}/fs`]);
    assert.equal((await call(client, 'Stat', { key: 'view-2' })).info.kind, 'VIEW');

    const usage = await call(client, 'Usage', { key: 'base' });
    assert.ok(usage.size >= 10_000, `usage ${usage.size}`);
    assert.equal(usage.inodes, 2);
  });

  test('errors carry the codes containerd maps back (ALREADY_EXISTS, NOT_FOUND, FAILED_PRECONDITION, INVALID_ARGUMENT)', async () => {
    await call(client, 'Prepare', { key: 'e-active', parent: '' });
    await assert.rejects(call(client, 'Prepare', { key: 'e-active', parent: '' }), { code: status.ALREADY_EXISTS });
    await assert.rejects(call(client, 'Prepare', { key: 'e2', parent: 'no-such' }), { code: status.NOT_FOUND });
    await assert.rejects(call(client, 'Prepare', { key: 'e3', parent: 'e-active' }), { code: status.INVALID_ARGUMENT });
    await assert.rejects(call(client, 'Stat', { key: 'nothing' }), { code: status.NOT_FOUND });
    await call(client, 'Commit', { name: 'e-done', key: 'e-active' });
    await assert.rejects(call(client, 'Commit', { name: 'e-done', key: 'e-done' }), { code: status.FAILED_PRECONDITION });
    await call(client, 'Prepare', { key: 'e-child', parent: 'e-done' });
    await assert.rejects(call(client, 'Remove', { key: 'e-done' }), { code: status.FAILED_PRECONDITION });
    await assert.rejects(call(client, 'Mounts', { key: 'e-done' }), { code: status.FAILED_PRECONDITION });
    await assert.rejects(call(client, 'Update', { info: { name: 'e-done', labels: {} }, updateMask: { paths: ['parent'] } }), {
      code: status.INVALID_ARGUMENT,
    });
  });

  test('Update: one label by path, all labels without a mask; List filters as the metadata snapshotter sends them', async () => {
    await call(client, 'Prepare', { key: 'u-active', parent: '', labels: { a: '1', b: '2' } });
    await call(client, 'Commit', { name: 'u', key: 'u-active', labels: { 'containerd.io/snapshot.ref': D('c') } });
    let info = (await call(client, 'Update', { info: { name: 'u', labels: { a: '9' } }, updateMask: { paths: ['labels.a', 'labels.b'] } }))
      .info;
    assert.deepEqual(info.labels, { a: '9', 'containerd.io/snapshot.ref': D('c') });
    info = (await call(client, 'Update', { info: { name: 'u', labels: { only: 'x', 'containerd.io/snapshot.ref': D('c') } } })).info;
    assert.deepEqual(info.labels, { only: 'x', 'containerd.io/snapshot.ref': D('c') });
    const found = await list(client, [`labels."containerd.io/snapshot.ref"==${D('c')},parent==""`]);
    assert.deepEqual(
      found.map((i) => i.name),
      ['u'],
    );
    assert.ok((await list(client)).length >= 3);
    assert.deepEqual((await list(client, ['kind==view'])).map((i) => i.name).sort(), ['view-1', 'view-2']);
    await assert.rejects(list(client, ['labels."open==x']), { code: status.INVALID_ARGUMENT });
  });

  test('remote labels with an unreachable peer fall back to an ordinary snapshot (containerd then downloads)', async () => {
    const res = await call(client, 'Prepare', {
      key: 'r-active',
      parent: '',
      labels: {
        'containerd.io/snapshot.ref': D('d'),
        'containerd.io/snapshot/remote/stargz.reference': '127.0.0.1:9/x/y:z',
        'containerd.io/snapshot/remote/stargz.digest': D('e'),
        'containerd.io/snapshot/stargz/toc.digest': D('f'),
      },
    });
    assert.equal(res.mounts[0].type, 'bind');
    assert.equal((await call(client, 'Stat', { key: 'r-active' })).info.kind, 'ACTIVE');
    await assert.rejects(call(client, 'Stat', { key: D('d') }), { code: status.NOT_FOUND });
    await call(client, 'Remove', { key: 'r-active' });
  });

  test('Remove frees the snapshot dir at once; Cleanup removes dirs no snapshot owns', async () => {
    const res = await call(client, 'Prepare', { key: 'gone', parent: '' });
    const dir = path.dirname(res.mounts[0].source);
    fs.writeFileSync(path.join(res.mounts[0].source, 'big'), Buffer.alloc(1 << 20, 1));
    await call(client, 'Remove', { key: 'gone' });
    assert.equal(fs.existsSync(dir), false);
    await assert.rejects(call(client, 'Remove', { key: 'gone' }), { code: status.NOT_FOUND });
    const orphan = path.join(sn.root, 'snapshots', 'new-orphan');
    fs.mkdirSync(path.join(orphan, 'fs'), { recursive: true });
    await call(client, 'Cleanup', {});
    assert.equal(fs.existsSync(orphan), false);
    assert.ok(fs.existsSync(snapDir('1')), 'live snapshots stay');
  });

  test('metadata survives a kill -9 and restart', async () => {
    const before = (await list(client)).map((i) => `${i.name}:${i.kind}:${i.parent}`).sort();
    client.close();
    await sn.service.kill9();
    sn = await sn.restart();
    client = snapshotsClient(sn.socket);
    const after = (await list(client)).map((i) => `${i.name}:${i.kind}:${i.parent}`).sort();
    assert.deepEqual(after, before);
    assert.equal((await call(client, 'Mounts', { key: 'container' })).mounts[0].type, 'overlay');
  });
});
