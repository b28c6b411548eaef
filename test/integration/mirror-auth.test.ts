// A registry behind htpasswd basic auth: credentials pass through the mirror, the registry's
// challenge reaches the client, and a cached private blob is never handed to a client the
// registry would refuse.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { request } from 'undici';
import { startContainerd } from '../fixtures/containerd.js';
import { basicAuth, buildImage, pushImage, pushRandomBlob, type BuiltImage, type PushedBlob } from '../fixtures/images.js';
import { STARLING_CLI, startPeer, type RunningPeerProcess } from '../fixtures/peer.js';
import { makeTempDir, run, runOk, type TempDir } from '../fixtures/processes.js';
import { startLyingRegistry, type LyingRegistry } from '../fixtures/lying-registry.js';
import { blobRequests, startRegistry, type Creds, type Registry } from '../fixtures/registry.js';
import { itemAt } from '../../src/common/indexing.js';

const MiB = 1024 * 1024;
const creds: Creds = { user: 'alice', password: 's3cret-pass' };

describe('peer mirror: private registry', { timeout: 300_000 }, () => {
  let registry: Registry;
  let peer: RunningPeerProcess;
  let image: BuiltImage;
  let blob: PushedBlob;
  let work: TempDir;
  /** A registry of an attacker's that says 200 to a HEAD of anything. */
  let yes: LyingRegistry;
  const ref = 'private/app:v1';

  before(async () => {
    work = await makeTempDir('starling-auth-');
    [registry, image] = await Promise.all([
      startRegistry({ htpasswd: creds }),
      buildImage({ withBusybox: true, layers: [{ sizeBytes: 5 * MiB, seed: 'auth-layer' }] }),
    ]);
    await pushImage(image.layoutDir, image.tag, registry.host, ref, { creds });
    blob = await pushRandomBlob(registry, 'private/app', 6 * MiB);
    yes = await startLyingRegistry();
    peer = await startPeer({ insecure: [registry.host, yes.host] });
  });
  after(async () => {
    await peer?.stop();
    await registry?.stop();
    await yes?.stop();
    await work?.remove();
  });

  const blobUrl = (digest: string) => `${peer.url}/v2/private/app/blobs/${digest}?ns=${registry.host}`;

  it('relays the registry challenge to an anonymous client', async () => {
    for (const path of ['/v2/', '/v2/private/app/manifests/v1']) {
      const response = await request(`${peer.url}${path}?ns=${registry.host}`);
      await response.body.dump();
      assert.equal(response.statusCode, 401, path);
      assert.match(String(response.headers['www-authenticate']), /^Basic realm=/, path);
    }
    const response = await request(blobUrl(blob.digest));
    await response.body.dump();
    assert.equal(response.statusCode, 401);
    assert.match(String(response.headers['www-authenticate']), /^Basic realm=/);
  });

  it('pulls with credentials through containerd and runs the image', async () => {
    const hostsDir = `${work.path}/hosts.d`;
    await runOk(process.execPath, [
      STARLING_CLI,
      'containerd-config',
      '--hosts-dir',
      hostsDir,
      '--mirror',
      peer.url,
      '--insecure-registry',
      registry.host,
    ]);
    const containerd = await startContainerd({ hostsDir });
    try {
      const denied = await containerd.ctr(['images', 'pull', '--hosts-dir', hostsDir, `${registry.host}/${ref}`]);
      assert.notEqual(denied.code, 0, 'no credentials, no image');
      await containerd
        .ctr(['images', 'pull', '--hosts-dir', hostsDir, '--user', `${creds.user}:${creds.password}`, `${registry.host}/${ref}`])
        .then((result) => assert.equal(result.code, 0, result.stderr));
      const file = itemAt(image.randomFiles, 0);
      const ran = await containerd.runContainer(`${registry.host}/${ref}`, ['sha256sum', file.path]);
      assert.equal(ran.code, 0, ran.stderr);
      assert.match(ran.stdout, new RegExp(file.sha256));
    } finally {
      await containerd.stop();
    }
  });

  it('serves a cached private blob only to clients the registry accepts', async () => {
    const withCreds = await request(blobUrl(blob.digest), { headers: basicAuth(creds) });
    const bytes = Buffer.from(await withCreds.body.arrayBuffer());
    assert.equal(withCreds.statusCode, 200);
    assert.equal(`sha256:${createHash('sha256').update(bytes).digest('hex')}`, blob.digest);

    const anonymous = await request(blobUrl(blob.digest));
    const anonymousBody = await anonymous.body.text();
    assert.equal(anonymous.statusCode, 401, 'anonymous client gets the registry challenge, not the cached bytes');
    assert.match(String(anonymous.headers['www-authenticate']), /^Basic realm=/);
    assert.ok(!anonymousBody.includes(bytes.subarray(0, 64).toString('latin1')));

    const wrong = await request(blobUrl(blob.digest), { headers: basicAuth({ user: creds.user, password: 'wrong' }) });
    await wrong.body.dump();
    assert.equal(wrong.statusCode, 401);

    const ranged = await request(blobUrl(blob.digest), { headers: { range: 'bytes=0-99' } });
    await ranged.body.dump();
    assert.equal(ranged.statusCode, 401, 'ranges of a private blob are private too');

    const gets = blobRequests(registry.requests(), blob.digest).length;
    const again = await request(blobUrl(blob.digest), { headers: basicAuth(creds) });
    await again.body.dump();
    assert.equal(again.statusCode, 200);
    assert.equal(blobRequests(registry.requests(), blob.digest).length, gets, 'served from the cache');
    assert.ok((await peer.metric('starling_peer_access_checks_total', { result: 'denied' })) >= 2);
  });

  it('starling get fetches a private blob with credentials and refuses without', async () => {
    const out = `${work.path}/blob.bin`;
    const target = `${registry.host}/private/app@${blob.digest}`;
    const refused = await run(process.execPath, [STARLING_CLI, 'get', target, '-o', out, '--peer', peer.url]);
    assert.equal(refused.code, 2);
    assert.match(refused.stderr, /peer answered 401/);
    await runOk(process.execPath, [
      STARLING_CLI,
      'get',
      target,
      '-o',
      out,
      '--peer',
      peer.url,
      '--creds',
      `${creds.user}:${creds.password}`,
    ]);
    const check = await runOk('sha256sum', [out]);
    assert.equal(`sha256:${check.stdout.split(' ')[0]}`, blob.digest);
  });

  it('gives no byte of a cached private blob to a client naming a registry that answers 200 to every HEAD', async () => {
    const cached = await request(blobUrl(blob.digest), { headers: basicAuth(creds) });
    const secret = Buffer.from(await cached.body.arrayBuffer());
    assert.equal(cached.statusCode, 200);
    yes.answerEveryHead(blob.size);
    {
      const via = (path: string) => `${peer.url}${path}?ns=${yes.host}`;
      for (const headers of [{}, { range: 'bytes=0-1023' }]) {
        const response = await request(via(`/v2/private/app/blobs/${blob.digest}`), { headers });
        const body = Buffer.from(await response.body.arrayBuffer());
        assert.notEqual(response.statusCode, 200, JSON.stringify(headers));
        assert.notEqual(response.statusCode, 206, JSON.stringify(headers));
        assert.equal(body.indexOf(secret.subarray(0, 32)), -1, 'none of the private bytes');
      }
      // The request went to the registry it named, which does not have the blob.
      assert.ok(yes.requests().some((r) => r.method === 'GET' && r.path.endsWith(blob.digest)));
      // Its refusal made it no source of the blob: the stored copy is still private.
      const anonymous = await request(blobUrl(blob.digest));
      assert.equal(anonymous.statusCode, 401, 'an anonymous client is still refused');
      await anonymous.body.dump();
      const tasks = await request(`${peer.url}/_starling/tasks`);
      assert.equal(tasks.statusCode, 200, 'the local host may list tasks');
      await tasks.body.dump();
    }
  });
});
