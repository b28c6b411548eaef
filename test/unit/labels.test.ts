import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { parseLabelFlags, readLabelsFile } from '../../src/peer/labels.js';

describe('host labels', () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'starling-labels-'));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('parses key=value flags and names a bad one', () => {
    assert.deepEqual(parseLabelFlags(['zone=a', 'rack=r1', 'note=x=y']), { zone: 'a', rack: 'r1', note: 'x=y' });
    assert.throws(() => parseLabelFlags(['zone']), /invalid label "zone" \(expected key=value\)/);
  });

  it('reads Kubernetes node labels, from a map or a node object, with short topology keys', async () => {
    const map = join(dir, 'labels.yaml');
    await writeFile(map, 'topology.kubernetes.io/zone: eu-1a\nkubernetes.io/hostname: gpu-7\nteam: ml\n');
    assert.deepEqual(readLabelsFile(map), {
      'topology.kubernetes.io/zone': 'eu-1a',
      zone: 'eu-1a',
      'kubernetes.io/hostname': 'gpu-7',
      hostname: 'gpu-7',
      team: 'ml',
    });
    const node = join(dir, 'node.json');
    await writeFile(node, JSON.stringify({ kind: 'Node', metadata: { name: 'gpu-7', labels: { 'topology.kubernetes.io/region': 'eu' } } }));
    assert.deepEqual(readLabelsFile(node), { 'topology.kubernetes.io/region': 'eu', region: 'eu' });
  });

  it('refuses files that hold no label map', async () => {
    const list = join(dir, 'list.yaml');
    await writeFile(list, '- a\n- b\n');
    assert.throws(() => readLabelsFile(list), /must hold a map of labels/);
    const numbers = join(dir, 'numbers.yaml');
    await writeFile(numbers, 'zone: 3\n');
    assert.throws(() => readLabelsFile(numbers), /label "zone" .* is not a string/);
    assert.throws(() => readLabelsFile(join(dir, 'missing.yaml')), /cannot read labels file/);
  });
});
