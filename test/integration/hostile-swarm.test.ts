// Private blobs in a swarm (docs/security.md): pieces of a private blob cross a peer's upload port
// only over TLS, only to a child whose client's registry is a source of the blob and accepts that
// client's credentials. A holder of the cluster token without registry credentials gets a clear
// 403; one with them gets the bytes; without TLS, private pieces never cross the port at all.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { request, type Dispatcher } from 'undici';
import { basicAuth, pushRandomBlob, type PushedBlob } from '../fixtures/images.js';
import { startLyingRegistry, type LyingRegistry } from '../fixtures/lying-registry.js';
import {
  clusterToken,
  pullThrough,
  startPeer,
  startScheduler,
  type RunningPeerProcess,
  type RunningSchedulerProcess,
} from '../fixtures/peer.js';
import { blobRequests, startRegistry, type Creds, type Registry } from '../fixtures/registry.js';
import { clusterAgent, tlsArgs } from '../fixtures/tls.js';

const MiB = 1024 * 1024;
const creds: Creds = { user: 'bob', password: 'private-pass' };

describe('hostile swarm: private pieces over the upload port', { timeout: 180_000 }, () => {
  let registry: Registry;
  let yes: LyingRegistry;
  let scheduler: RunningSchedulerProcess;
  let holder: RunningPeerProcess;
  let plain: { scheduler: RunningSchedulerProcess; peer: RunningPeerProcess };
  let blob: PushedBlob;
  let agent: Dispatcher;
  let token: string;
  const repo = 'private/layers';

  before(async () => {
    [registry, yes] = await Promise.all([startRegistry({ htpasswd: creds }), startLyingRegistry()]);
    yes.answerEveryHead(6 * MiB);
    blob = await pushRandomBlob(registry, repo, 6 * MiB);
    token = (await clusterToken()).token;
    agent = await clusterAgent();
    const tls = await tlsArgs();
    scheduler = await startScheduler({ ip: '127.0.0.61', extraArgs: tls });
    holder = await startPeer({ ip: '127.0.0.62', schedulers: [scheduler.address], insecure: [registry.host, yes.host], extraArgs: tls });
    const plainScheduler = await startScheduler({ ip: '127.0.0.63' });
    plain = {
      scheduler: plainScheduler,
      peer: await startPeer({ ip: '127.0.0.64', schedulers: [plainScheduler.address], insecure: [registry.host] }),
    };
    for (const peer of [holder, plain.peer]) {
      const pulled = await request(`${peer.url}/v2/${repo}/blobs/${blob.digest}?ns=${registry.host}`, { headers: basicAuth(creds) });
      assert.equal(sha(Buffer.from(await pulled.body.arrayBuffer())), blob.digest);
    }
  });
  after(async () => {
    for (const running of [holder, plain?.peer, scheduler, plain?.scheduler, registry, yes]) await running?.stop().catch(() => undefined);
  });

  const sha = (bytes: Buffer) => `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
  const pieceUrl = (peer: RunningPeerProcess, scheme: 'http' | 'https') =>
    `${scheme}://${peer.host.split(':')[0]}:${peer.options.uploadPort}/_starling/pieces/${blob.digest}/0`;
  const asChild = (named: string, authorization?: string) => ({
    authorization: `Bearer ${token}`,
    'x-starling-origin': `http://${named}/v2/${repo}/blobs/${blob.digest}`,
    ...(authorization ? { 'x-starling-registry-authorization': authorization } : {}),
  });

  it('refuses a piece of a private blob to a cluster-token holder without registry credentials, naming why', async () => {
    const response = await request(pieceUrl(holder, 'https'), { headers: asChild(registry.host), dispatcher: agent });
    assert.equal(response.statusCode, 403);
    assert.match(
      ((await response.body.json()) as { error: string }).error,
      new RegExp(`registry http://${registry.host.replace(/\./g, '\\.')} answered 401`),
    );
    const noOrigin = await request(pieceUrl(holder, 'https'), { headers: { authorization: `Bearer ${token}` }, dispatcher: agent });
    assert.equal(noOrigin.statusCode, 403);
    assert.match(((await noOrigin.body.json()) as { error: string }).error, /only to a child whose client names one of its registries/);
  });

  it('gives the piece to a child whose client the registry accepts, and refuses one naming another registry', async () => {
    const { authorization } = basicAuth(creds) as { authorization: string };
    const allowed = await request(pieceUrl(holder, 'https'), { headers: asChild(registry.host, authorization), dispatcher: agent });
    assert.equal(allowed.statusCode, 200);
    const bytes = Buffer.from(await allowed.body.arrayBuffer());
    assert.equal(bytes.length, 4 * MiB);
    const foreign = await request(pieceUrl(holder, 'https'), { headers: asChild(yes.host, authorization), dispatcher: agent });
    assert.equal(foreign.statusCode, 403, 'a registry that says yes to everything is no source of the blob');
    await foreign.body.dump();
  });

  it('lets a peer with the credentials take the private blob from the swarm, the registry sending no more copies', async () => {
    const child = await startPeer({
      ip: '127.0.0.65',
      schedulers: [scheduler.address],
      insecure: [registry.host],
      extraArgs: await tlsArgs(),
    });
    try {
      const gets = blobRequests(registry.requests(), blob.digest).length;
      const anonymous = await pullThrough(child, registry, repo, blob.digest);
      assert.equal(anonymous.status, 401, 'no credentials, no blob');
      const response = await request(`${child.url}/v2/${repo}/blobs/${blob.digest}?ns=${registry.host}`, { headers: basicAuth(creds) });
      assert.equal(sha(Buffer.from(await response.body.arrayBuffer())), blob.digest);
      assert.equal(await child.metric('starling_peer_downloaded_bytes_total', { source: 'peer' }), blob.size, 'every byte from the holder');
      assert.equal(blobRequests(registry.requests(), blob.digest).length, gets, 'no blob GET reached the registry');
    } finally {
      await child.stop();
    }
  });

  it('never sends a private piece over plain HTTP, whatever the child presents', async () => {
    const { authorization } = basicAuth(creds) as { authorization: string };
    const response = await request(pieceUrl(plain.peer, 'http'), { headers: asChild(registry.host, authorization) });
    assert.equal(response.statusCode, 403);
    assert.match(((await response.body.json()) as { error: string }).error, /served only over TLS/);
  });
});
