import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { loadConfig } from '../../src/common/config.js';
import { parseRate, parseSize } from '../../src/common/units.js';
import { peerConfigSchema } from '../../src/peer/config.js';

describe('peer configuration', () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'starling-config-'));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  async function file(text: string): Promise<string> {
    const path = join(dir, `c${Math.random()}.yaml`);
    await writeFile(path, text);
    return path;
  }

  it('reads YAML, lets flags win and fills defaults', async () => {
    const path = await file('dataDir: /from/file\nmirror:\n  listen: 127.0.0.1:7000\nstorage:\n  quota: 2GiB\n');
    const config = loadConfig(peerConfigSchema, { file: path, flags: { dataDir: '/from/flag', mirror: { listen: undefined } } });
    assert.equal(config.dataDir, '/from/flag');
    assert.equal(config.mirror.listen, '127.0.0.1:7000');
    assert.equal(config.storage.quota, 2 * 2 ** 30);
    assert.equal(config.storage.highWatermark, 0.9);
    assert.deepEqual(config.registries.insecure, []);
    assert.equal(config.swarm.uploadMaxConnections, 8192);
  });

  it('takes connection caps for the mirror and the upload server, and refuses one below 1', async () => {
    const config = loadConfig(peerConfigSchema, {
      file: await file('dataDir: /d\nmirror:\n  maxConnections: 100\nswarm:\n  uploadMaxConnections: 300\n'),
    });
    assert.equal(config.mirror.maxConnections, 100);
    assert.equal(config.swarm.uploadMaxConnections, 300);
    const zero = await file('dataDir: /d\nswarm:\n  uploadMaxConnections: 0\n');
    assert.throws(() => loadConfig(peerConfigSchema, { file: zero }), /swarm\.uploadMaxConnections/);
  });

  it('names every bad key', async () => {
    const path = await file(
      'dataDir: /d\nmirorr: {}\nstorage:\n  quota: lots\n  lowWatermark: 0.95\nregistries:\n  default: ftp://x\n  insecure: ["a/b"]\n',
    );
    assert.throws(
      () => loadConfig(peerConfigSchema, { file: path }),
      (error: Error) => {
        assert.match(error.message, /unknown key "mirorr"/);
        assert.match(error.message, /storage\.quota: invalid size "lots"/);
        assert.match(error.message, /registries\.default: expected a base URL/);
        assert.match(error.message, /registries\.insecure\.0: expected HOST\[:PORT\]/);
        return true;
      },
    );
  });

  it('checks the watermarks against each other', async () => {
    assert.throws(
      () => loadConfig(peerConfigSchema, { flags: { dataDir: '/d', storage: { highWatermark: 0.5, lowWatermark: 0.8 } } }),
      /storage\.lowWatermark: lowWatermark must be below highWatermark/,
    );
  });

  it('explains unreadable files', async () => {
    assert.throws(() => loadConfig(peerConfigSchema, { file: join(dir, 'missing.yaml') }), /cannot read config file/);
    const broken = await file('a: [\n');
    assert.throws(() => loadConfig(peerConfigSchema, { file: broken }), /is not valid YAML/);
    const list = await file('- 1\n- 2\n');
    assert.throws(() => loadConfig(peerConfigSchema, { file: list }), /must hold a mapping/);
  });
});

describe('units', () => {
  it('parses sizes and rates', () => {
    assert.equal(parseSize('4MiB'), 4 * 2 ** 20);
    assert.equal(parseSize('1.5GB'), 1.5e9);
    assert.equal(parseRate('800Mbit'), 100e6);
    assert.equal(parseRate('12MB/s'), 12e6);
    assert.throws(() => parseSize('4 parsecs'), /invalid size "4 parsecs"/);
  });
});
