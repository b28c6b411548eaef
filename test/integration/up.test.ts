// `starling up`, the README's first command: scheduler, seed and mirror on one machine.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { readFileSync } from 'node:fs';
import { Agent, request } from 'undici';
import { pushRandomBlob } from '../fixtures/images.js';
import { STARLING_CLI } from '../fixtures/peer.js';
import { makeTempDir, spawnService, waitFor, waitForHttp, type Service, type TempDir } from '../fixtures/processes.js';
import { blobBytesSent, startRegistry, type Registry } from '../fixtures/registry.js';

describe('starling up', { timeout: 120_000 }, () => {
  let registry: Registry;
  let work: TempDir;
  let up: Service;

  before(async () => {
    work = await makeTempDir('starling-up-');
    registry = await startRegistry();
    up = await spawnService({
      cmd: process.execPath,
      args: [STARLING_CLI, 'up', '--data-dir', work.path, '--insecure-registry', registry.host],
      name: 'starling-up',
    });
    await waitForHttp('http://127.0.0.1:65001/healthz', 20_000, up);
  });
  after(async () => {
    await up?.stop();
    await registry?.stop();
    await work?.remove();
  });

  /** Trusts the CA `up` made at its first start. */
  const cluster = () => new Agent({ connect: { ca: readFileSync(`${work.path}/tls/ca.pem`), checkServerIdentity: () => undefined } });

  it('prints where things are and serves pulls through the seed', async () => {
    await waitFor(() => up.readLog().includes('Point containerd at the mirror'), 10_000, 'the start-up banner');
    assert.match(up.readLog(), /peer mirror\s+http:\/\/127\.0\.0\.1:65001/);
    assert.match(up.readLog(), /web console\s+https:\/\/127\.0\.0\.1:8080\//);
    const page = await request('https://127.0.0.1:8080/', { dispatcher: cluster() });
    assert.equal(page.statusCode, 200);
    assert.match(String(page.headers['content-type']), /text\/html/);
    assert.match(await page.body.text(), /<div id="root">|<script/, 'the built console is served');
    const token = /admin token\s+(\S+)/.exec(up.readLog())?.[1];
    assert.ok(token, 'the first start prints the admin token once');
    // The manager knows the seed and the mirror peer, and the scheduler.
    await waitFor(
      async () => {
        const response = await request('https://127.0.0.1:8080/api/v1/peers', {
          headers: { authorization: `Bearer ${token}` },
          dispatcher: cluster(),
        });
        const peers = (await response.body.json()) as Array<{ state: string }>;
        return peers.filter((peer) => peer.state === 'active').length === 2;
      },
      15_000,
      'both peers registered with the manager',
    );
    const blob = await pushRandomBlob(registry, 'up/blob', 9 * 1024 * 1024);
    const response = await request(`http://127.0.0.1:65001/v2/up/blob/blobs/${blob.digest}?ns=${registry.host}`);
    const hash = createHash('sha256');
    for await (const chunk of response.body) hash.update(chunk);
    assert.equal(`sha256:${hash.digest('hex')}`, blob.digest);
    // One copy (the seed reads the last piece on a request of its own, then the rest).
    await waitFor(() => blobBytesSent(registry.requests(), blob.digest) >= blob.size, 5000, 'registry access log').catch(() => undefined);
    assert.equal(blobBytesSent(registry.requests(), blob.digest), blob.size);
    const metrics = await (await request('http://127.0.0.1:65001/metrics')).body.text();
    assert.match(metrics, /starling_peer_downloaded_bytes_total\{source="seed"\} 9437184/, 'the mirror got the blob from the seed');
  });

  it('made a cluster token and a CA at first start, and every internal endpoint requires them', async () => {
    const token = readFileSync(`${work.path}/cluster-token`, 'utf8').trim();
    assert.match(token, /^[0-9a-f]{48}$/);
    // A rogue scheduler registering itself with the manager, without the token: refused.
    const rogue = await request('https://127.0.0.1:8080/api/v1/schedulers/keepalive', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ hostname: 'rogue', ip: '127.0.0.1', port: 9 }),
      dispatcher: cluster(),
    });
    assert.equal(rogue.statusCode, 401);
    assert.match(await rogue.body.text(), /cluster token is missing or wrong/);
    // The seed's upload port: no preheat (a URL and headers to fetch) without the token, and no plain HTTP.
    const preheat = await request('https://127.0.0.1:65012/_starling/preheat', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        taskId: `sha256:${'0'.repeat(64)}`,
        contentLength: 3001,
        pieceSize: 4194304,
        origin: { url: 'http://127.0.0.1:9/v2/x/blobs/sha256:0', headers: {} },
      }),
      dispatcher: cluster(),
    });
    assert.equal(preheat.statusCode, 401);
    await preheat.body.dump();
    await assert.rejects(request('http://127.0.0.1:65012/healthz', { headersTimeout: 2_000 }), 'the upload port speaks only TLS');
    // Without the cluster CA, the manager's certificate is not trusted.
    await assert.rejects(request('https://127.0.0.1:8080/healthz'), /certificate/);
    assert.ok(up.running, 'still serving');
  });
});
