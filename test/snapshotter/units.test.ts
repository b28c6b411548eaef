// The snapshotter's pure parts: containerd's filter language and the remote-layer labels.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { compileFilters } from '../../src/snapshotter/filters.js';
import { remoteLayerFromLabels, TOC_DIGEST_LABEL } from '../../src/snapshotter/labels.js';

const D1 = `sha256:${'a'.repeat(64)}`;
const D2 = `sha256:${'b'.repeat(64)}`;
const D3 = `sha256:${'c'.repeat(64)}`;
const item = (over: Partial<{ name: string; parent: string; kind: string; labels: Record<string, string> }> = {}) => ({
  name: 'default/3/sha256:x',
  parent: 'default/2/sha256:p',
  kind: 'committed',
  labels: { 'containerd.io/snapshot.ref': D1, plain: 'v' },
  ...over,
});

test("filters: the form containerd's metadata snapshotter sends after ALREADY_EXISTS", () => {
  const match = compileFilters([`labels."containerd.io/snapshot.ref"==${D1},parent=="default/2/sha256:p"`]);
  assert.equal(match(item()), true);
  assert.equal(match(item({ parent: 'other' })), false);
  assert.equal(match(item({ labels: { 'containerd.io/snapshot.ref': D2 } })), false);
});

test('filters: alternatives, !=, ~=, presence, unknown fields', () => {
  assert.equal(compileFilters([])(item()), true);
  assert.equal(compileFilters(['kind==active', 'kind==committed'])(item()), true);
  assert.equal(compileFilters(['kind!=committed'])(item()), false);
  assert.equal(compileFilters(['name~=/^default\\/3/'])(item()), true);
  assert.equal(compileFilters(['name~="^other"'])(item()), false);
  assert.equal(compileFilters(['labels.plain'])(item()), true);
  assert.equal(compileFilters(['labels.missing'])(item()), false);
  assert.equal(compileFilters(['size==3'])(item()), false);
  assert.throws(() => compileFilters(['labels."unterminated==x']), /unterminated/);
  assert.throws(() => compileFilters(['kind==a,']), /expected a field name/);
});

test('labels: ctr-remote rpull labels make a remote layer; registry and repository come from the ref', () => {
  const spec = remoteLayerFromLabels({
    'containerd.io/snapshot.ref': 'sha256:chain',
    'containerd.io/snapshot/remote/stargz.reference': '127.0.0.1:5000/team/app:v1',
    'containerd.io/snapshot/remote/stargz.digest': D1,
    'containerd.io/snapshot/remote/stargz.prefetch': '10485760',
    // This layer and the image's later ones (the next layers are resolved ahead); a bad digest is left out.
    'containerd.io/snapshot/remote/stargz.layers': `${D1},${D2},md5:x,${D3}`,
    [TOC_DIGEST_LABEL]: D2,
  });
  assert.deepEqual(spec, {
    target: 'sha256:chain',
    image: { registry: '127.0.0.1:5000', repository: 'team/app', tag: 'v1', digest: undefined },
    digest: D1,
    tocDigest: D2,
    prefetchSize: 10485760,
    nextLayers: [D2, D3],
  });
});

test('labels: CRI labels work too; missing or bad labels name the reason', () => {
  const cri = remoteLayerFromLabels({
    'containerd.io/snapshot.ref': 'c',
    'containerd.io/snapshot/cri.image-ref': 'docker.io/library/python:3',
    'containerd.io/snapshot/cri.layer-digest': D1,
    [TOC_DIGEST_LABEL]: D2,
  });
  assert.equal(typeof cri, 'object');
  assert.equal((cri as { image: { repository: string } }).image.repository, 'library/python');
  const base = {
    'containerd.io/snapshot.ref': 'c',
    'containerd.io/snapshot/remote/stargz.reference': 'r.io/a:b',
    'containerd.io/snapshot/remote/stargz.digest': D1,
  };
  assert.match(remoteLayerFromLabels({}) as string, /snapshot\.ref/);
  assert.match(remoteLayerFromLabels(base) as string, /not an eStargz layer/);
  assert.match(remoteLayerFromLabels({ ...base, [TOC_DIGEST_LABEL]: 'sha256:short' }) as string, /TOC digest/);
  assert.match(
    remoteLayerFromLabels({ ...base, 'containerd.io/snapshot/remote/stargz.digest': 'md5:x', [TOC_DIGEST_LABEL]: D2 }) as string,
    /not a sha256/,
  );
});
