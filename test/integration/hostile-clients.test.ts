// Clients that are not who the ports expect: another host on the network, callers without the
// cluster token or with a wrong one, malformed and oversized requests, connections left idle.
// Each gets a clear answer, the process goes on serving, and nothing it holds is lost.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { after, before, describe, it } from 'node:test';
import { request } from 'undici';
import { createNetns, type Netns } from '../fixtures/netns.js';
import { startPeer, type RunningPeerProcess } from '../fixtures/peer.js';
import { freePort, makeTempDir, type TempDir } from '../fixtures/processes.js';

describe('hostile clients: the peer mirror', { timeout: 120_000 }, () => {
  let netns: Netns;
  let work: TempDir;
  let peer: RunningPeerProcess;
  let token: string;

  before(async () => {
    work = await makeTempDir('starling-hostile-');
    netns = await createNetns();
    token = randomBytes(24).toString('hex');
    await writeFile(`${work.path}/cluster.token`, token);
    // A mirror listening where another host can reach it (an operator's choice; loopback is the default).
    peer = await startPeer({ ip: netns.hostIp, port: await freePort(netns.hostIp), extraArgs: ['--cluster-token-file', `${work.path}/cluster.token`] });
  });
  after(async () => {
    await peer?.stop();
    await netns?.remove();
    await work?.remove();
  });

  it('lists its tasks only to this host or a holder of the cluster token', async () => {
    const fromElsewhere = await netns.exec('curl', ['-s', '-o', '/dev/null', '-w', '%{http_code}', `${peer.url}/_starling/tasks`]);
    assert.equal(fromElsewhere.stdout, '403');
    const wrongToken = await netns.exec('curl', ['-s', '-o', '/dev/null', '-w', '%{http_code}', '-H', 'authorization: Bearer nope', `${peer.url}/_starling/tasks`]);
    assert.equal(wrongToken.stdout, '403');
    const withToken = await netns.exec('curl', ['-s', '-H', `authorization: Bearer ${token}`, `${peer.url}/_starling/tasks`]);
    assert.deepEqual(JSON.parse(withToken.stdout), { tasks: [] });
    const local = await request(`${peer.url}/_starling/tasks`);
    assert.equal(local.statusCode, 200, 'this host may');
    await local.body.dump();
  });
});
