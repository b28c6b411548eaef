// The peer mirror against a real docker-registry: whole blobs, ranges, concurrency,
// corruption, restarts and bad input. Clients here speak HTTP directly (undici).
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFile, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { request as rawRequest } from 'node:http';
import { request } from 'undici';
import { startPeer, type RunningPeerProcess } from '../fixtures/peer.js';
import { pushRandomBlob, type PushedBlob } from '../fixtures/images.js';
import { blobBytesSent, blobRequests, corruptBlob, startRegistry, type Registry } from '../fixtures/registry.js';
import { waitFor } from '../fixtures/processes.js';
import { itemAt } from '../../src/common/indexing.js';

const MiB = 1024 * 1024;

function sha256(data: Buffer): string {
  return `sha256:${createHash('sha256').update(data).digest('hex')}`;
}

describe('peer mirror: blobs through a real registry', { timeout: 300_000 }, () => {
  let registry: Registry;
  let peer: RunningPeerProcess;
  let small: PushedBlob;
  let smallBytes: Buffer;

  before(async () => {
    registry = await startRegistry();
    peer = await startPeer({ insecure: [registry.host] });
    small = await pushRandomBlob(registry, 'test/small', 10 * MiB + 333);
    smallBytes = await readFile(small.path);
  });
  after(async () => {
    await peer?.stop();
    await registry?.stop();
  });

  const blobUrl = (digest: string, repo = 'test/small') => `${peer.url}/v2/${repo}/blobs/${digest}?ns=${registry.host}`;

  async function get(url: string, headers: Record<string, string> = {}) {
    const response = await request(url, { headers });
    const body = Buffer.from(await response.body.arrayBuffer());
    return { status: response.statusCode, headers: response.headers, body };
  }

  it('answers a range of an uncached blob by fetching only the covering pieces', async () => {
    const before = blobBytesSent(registry.requests(), small.digest);
    const response = await get(blobUrl(small.digest), { range: 'bytes=5000000-5000099' });
    assert.equal(response.status, 206);
    assert.equal(response.headers['content-range'], `bytes 5000000-5000099/${small.size}`);
    assert.ok(response.body.equals(smallBytes.subarray(5000000, 5000100)));
    await waitFor(() => blobRequests(registry.requests(), small.digest).length > 0, 5000, 'registry access log');
    const sent = blobBytesSent(registry.requests(), small.digest) - before;
    assert.equal(sent, 4 * MiB, 'exactly the one 4 MiB piece covering the range came from the registry');
    const ranged = blobRequests(registry.requests(), small.digest);
    assert.ok(
      ranged.every((r) => r.status === 206),
      'the origin was asked with Range',
    );
  });

  it('serves single, suffix, open-ended and multiple ranges, and 416 for unsatisfiable ones', async () => {
    const size = small.size;
    const single = await get(blobUrl(small.digest), { range: 'bytes=0-9' });
    assert.equal(single.status, 206);
    assert.ok(single.body.equals(smallBytes.subarray(0, 10)));

    const suffix = await get(blobUrl(small.digest), { range: 'bytes=-100' });
    assert.equal(suffix.headers['content-range'], `bytes ${size - 100}-${size - 1}/${size}`);
    assert.ok(suffix.body.equals(smallBytes.subarray(size - 100)));

    const open = await get(blobUrl(small.digest), { range: `bytes=${size - 5}-` });
    assert.equal(open.headers['content-length'], '5');
    assert.ok(open.body.equals(smallBytes.subarray(size - 5)));

    const multi = await get(blobUrl(small.digest), { range: 'bytes=0-4,8388600-8388700' });
    assert.equal(multi.status, 206);
    const boundaryMatch = /boundary=(\S+)/.exec(String(multi.headers['content-type']));
    assert.ok(boundaryMatch, `a multipart Content-Type: ${String(multi.headers['content-type'])}`);
    const boundary = itemAt(boundaryMatch, 1);
    const text = multi.body.toString('latin1');
    const parts = text.split(`--${boundary}`).filter((p) => p.includes('Content-Range'));
    assert.equal(parts.length, 2);
    const [first, second] = [itemAt(parts, 0), itemAt(parts, 1)];
    assert.match(first, new RegExp(`Content-Range: bytes 0-4/${size}`));
    assert.match(second, new RegExp(`Content-Range: bytes 8388600-8388700/${size}`));
    const secondBody = Buffer.from(itemAt(second.split('\r\n\r\n'), 1).replace(/\r\n$/, ''), 'latin1');
    assert.ok(secondBody.equals(smallBytes.subarray(8388600, 8388701)));
    assert.equal(Number(multi.headers['content-length']), multi.body.length);

    const unsatisfiable = await get(blobUrl(small.digest), { range: `bytes=${size}-` });
    assert.equal(unsatisfiable.status, 416);
    assert.equal(unsatisfiable.headers['content-range'], `bytes */${size}`);
    assert.equal(JSON.parse(unsatisfiable.body.toString()).errors[0].code, 'RANGE_INVALID');
  });

  it('streams the whole blob, verified, then serves it from disk', async () => {
    const whole = await get(blobUrl(small.digest));
    assert.equal(whole.status, 200);
    assert.equal(whole.headers['docker-content-digest'], small.digest);
    assert.equal(sha256(whole.body), small.digest);
    // The registry logs a request once its response is done, which may trail the peer's last byte:
    // wait until it has logged every blob GET the peer sent (only this blob's, so far).
    const sent = await peer.metric('starling_peer_origin_requests_total');
    await waitFor(() => blobRequests(registry.requests(), small.digest).length >= sent, 10_000, "the registry's log of the peer's GETs");
    assert.equal(blobRequests(registry.requests(), small.digest).length, sent, 'the registry logged the GETs the peer counted');
    const requestsBefore = blobRequests(registry.requests(), small.digest).length;
    const again = await get(blobUrl(small.digest), { range: 'bytes=7000000-7000009' });
    assert.ok(again.body.equals(smallBytes.subarray(7000000, 7000010)));
    const head = await request(blobUrl(small.digest), { method: 'HEAD' });
    assert.equal(head.headers['content-length'], String(small.size));
    await head.body.dump();
    assert.equal(blobRequests(registry.requests(), small.digest).length, requestsBefore, 'cached: no new blob GET');
    assert.equal((await peer.metric('starling_peer_downloaded_bytes_total', { source: 'origin' })) >= small.size, true);
  });

  it('makes one origin fetch for 8 concurrent clients of a 200 MB blob', async () => {
    const big = await pushRandomBlob(registry, 'test/big', 200 * 1000 * 1000);
    const clients = await Promise.all(
      Array.from({ length: 8 }, async () => {
        const response = await request(blobUrl(big.digest, 'test/big'));
        const hash = createHash('sha256');
        for await (const chunk of response.body) hash.update(chunk);
        return { status: response.statusCode, digest: `sha256:${hash.digest('hex')}` };
      }),
    );
    for (const client of clients) assert.deepEqual(client, { status: 200, digest: big.digest });
    await waitFor(() => blobRequests(registry.requests(), big.digest).length > 0, 5000, 'registry access log');
    assert.equal(blobRequests(registry.requests(), big.digest).length, 1, 'one GET of the blob reached the registry');
    assert.equal(blobBytesSent(registry.requests(), big.digest), big.size, 'the registry sent exactly one copy');
  });

  it('serves cached blobs from disk with sendfile: whole, ranges and multipart byte-exact; a client leaving mid-transfer harms no other', async () => {
    const before = await peer.metric('starling_peer_sendfile_bytes_total');
    const whole = await get(blobUrl(small.digest));
    assert.equal(sha256(whole.body), small.digest);
    const ranged = await get(blobUrl(small.digest), { range: 'bytes=1000000-8999999' });
    assert.ok(ranged.body.equals(smallBytes.subarray(1000000, 9000000)));
    const multi = await get(blobUrl(small.digest), { range: 'bytes=0-2999999,5000000-7999999' });
    assert.equal(multi.status, 206);
    for (const [start, end] of [
      [0, 3000000],
      [5000000, 8000000],
    ] as const) {
      assert.ok(multi.body.indexOf(smallBytes.subarray(start, end)) > 0, `part ${start}-${end - 1} byte-exact`);
    }
    const sent = (await peer.metric('starling_peer_sendfile_bytes_total')) - before;
    assert.equal(sent, small.size + 8000000 + 6000000, 'every byte of these cached reads went out with sendfile');

    // Clients that leave part-way through a 200 MB cached blob, while another reads it whole.
    const big = await pushRandomBlob(registry, 'test/big', 200 * 1000 * 1000);
    const leavers = Array.from({ length: 4 }, async () => {
      const response = await request(blobUrl(big.digest, 'test/big'));
      for await (const _chunk of response.body) break; // reads one chunk, then closes the connection
    });
    const reader = (async () => {
      const response = await request(blobUrl(big.digest, 'test/big'));
      const hash = createHash('sha256');
      for await (const chunk of response.body) hash.update(chunk);
      return `sha256:${hash.digest('hex')}`;
    })();
    await Promise.all(leavers);
    assert.equal(await reader, big.digest);
    const health = await request(`${peer.url}/healthz`);
    assert.equal(health.statusCode, 200);
    await health.body.dump();
  });

  it('refuses a blob whose bytes do not match its digest and stores nothing of it', async () => {
    const bad = await pushRandomBlob(registry, 'test/bad', 9 * MiB);
    await corruptBlob(registry, bad.digest);
    const response = await request(blobUrl(bad.digest, 'test/bad'));
    assert.equal(response.statusCode, 200, 'streaming starts before the end is known');
    await assert.rejects(response.body.arrayBuffer(), 'the connection is cut before the last piece');
    await waitFor(async () => (await peer.metric('starling_peer_blob_verification_failures_total')) === 1, 5000, 'failure metric');
    const hex = bad.digest.slice('sha256:'.length);
    const stored = await readdir(join(peer.dataDir, 'store/blobs/sha256'));
    assert.ok(!stored.includes(hex), 'nothing of the bad blob is left on disk');
    // A client asking again gets the same refusal, never bytes from a cache.
    const again = await request(blobUrl(bad.digest, 'test/bad'));
    await assert.rejects(again.body.arrayBuffer());
  });

  it('answers bad names, digests, ranges and methods with OCI errors', async () => {
    const cases: Array<[string, string, Record<string, string>, number, string]> = [
      ['GET', `/v2/Bad_Name/blobs/${small.digest}`, {}, 400, 'NAME_INVALID'],
      ['GET', `/v2/a/../b/blobs/${small.digest}`, {}, 400, 'NAME_INVALID'],
      ['GET', `/v2/../../etc/blobs/${small.digest}`, {}, 400, 'NAME_INVALID'],
      ['GET', '/v2/test/small/blobs/sha256:1234', {}, 400, 'DIGEST_INVALID'],
      ['GET', `/v2/test/small/blobs/md5:${'a'.repeat(32)}`, {}, 400, 'DIGEST_INVALID'],
      ['GET', `/v2/test/small/blobs/${small.digest}`, { range: 'bytes=9-1' }, 400, 'RANGE_INVALID'],
      ['GET', `/v2/test/small/blobs/${small.digest}`, { range: 'lines=1-2' }, 400, 'RANGE_INVALID'],
      ['GET', '/v2/test/small/manifests/..bad', {}, 400, 'MANIFEST_INVALID'],
      ['GET', '/v2/test/small/nothing/here', {}, 404, 'UNSUPPORTED'],
      ['PUT', `/v2/test/small/blobs/${small.digest}`, {}, 405, 'UNSUPPORTED'],
      ['GET', `/v2/test/small/blobs/sha256:${'0'.repeat(64)}`, {}, 404, 'BLOB_UNKNOWN'],
    ];
    for (const [method, path, headers, status, code] of cases) {
      // node:http sends the path as written: URL parsers would resolve the ".." first.
      const response = await sendRaw(method, `${path}?ns=${registry.host}`, headers);
      assert.equal(response.status, status, `${method} ${path}: ${response.body.slice(0, 200)}`);
      assert.equal(JSON.parse(response.body).errors[0].code, code, `${method} ${path}`);
    }
    const badRegistry = await request(`${peer.url}/v2/test/small/blobs/${small.digest}?ns=evil.com/x`);
    assert.equal(badRegistry.statusCode, 400);
    assert.match(await badRegistry.body.text(), /invalid upstream registry/);
  });

  function sendRaw(method: string, path: string, headers: Record<string, string>): Promise<{ status: number; body: string }> {
    const [hostname, port] = peer.host.split(':');
    return new Promise((resolve, reject) => {
      const req = rawRequest({ hostname, port: Number(port), method, path, headers }, (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => (body += chunk));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      });
      req.on('error', reject);
      req.end();
    });
  }

  it('resumes a download cut by a restart and serves a correct blob', async () => {
    const slowPeer = await startPeer({ insecure: [registry.host], extraArgs: ['--download-rate-limit', '40MB'] });
    try {
      const blob = await pushRandomBlob(registry, 'test/resume', 80 * MiB);
      const first = await request(`${slowPeer.url}/v2/test/resume/blobs/${blob.digest}?ns=${registry.host}`);
      const reading = (async () => {
        for await (const _chunk of first.body); // keep the download going until the kill
      })().catch(() => undefined);
      // Stored, not received: the client gets the origin's bytes before their pieces are stored.
      await waitFor(
        async () => (await slowPeer.metric('starling_peer_storage_bytes')) >= 30 * MiB,
        20_000,
        'first half of the download stored',
      );
      await slowPeer.service.kill9();
      await reading;
      const restarted = await slowPeer.restart();
      try {
        const sentBefore = blobBytesSent(registry.requests(), blob.digest);
        const response = await get(`${restarted.url}/v2/test/resume/blobs/${blob.digest}?ns=${registry.host}`);
        assert.equal(response.status, 200);
        assert.equal(sha256(response.body), blob.digest);
        await waitFor(() => blobBytesSent(registry.requests(), blob.digest) > sentBefore, 5000, 'registry access log');
        const resent = blobBytesSent(registry.requests(), blob.digest) - sentBefore;
        assert.ok(resent < blob.size - 20 * MiB, `after the restart only the missing part came again (${resent} bytes)`);
      } finally {
        await restarted.stop();
      }
    } finally {
      if (slowPeer.service.running) await slowPeer.stop();
    }
  });
});
