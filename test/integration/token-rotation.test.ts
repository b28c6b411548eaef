// Rotating the cluster token with no gap, on real processes: each holds its own copy of the token
// file (as each node mounts the Secret), the copies change one step at a time, and pulls go through
// the swarm at every step. A process that holds only the old token once the rotation is over is
// refused, and a bad edit of a file locks no one out.
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { request } from 'undici';
import { pushRandomBlob } from '../fixtures/images.js';
import { pullThrough, startPeer, startScheduler, type RunningPeerProcess, type RunningSchedulerProcess } from '../fixtures/peer.js';
import { makeTempDir, waitFor, type Service, type TempDir } from '../fixtures/processes.js';
import { blobBytesSent, startRegistry, type Registry } from '../fixtures/registry.js';

const MB = 1000 * 1000;
const OLD = 'rotation-old-token-0123456789abcdef';
const NEW = 'rotation-new-token-fedcba9876543210';

/** How many times a process has logged that it reloaded its token file. */
const reloads = (service: Service) => service.readLog().split('cluster token file reloaded').length - 1;

describe('cluster token rotation', { timeout: 180_000 }, () => {
  let registry: Registry;
  let scheduler: RunningSchedulerProcess;
  let first: RunningPeerProcess;
  let second: RunningPeerProcess;
  const files = { scheduler: '', first: '', second: '' };
  const running: Array<{ stop(): Promise<void> }> = [];
  let dir: TempDir | undefined;

  before(async () => {
    registry = await startRegistry();
    dir = await makeTempDir('starling-rotation-');
    for (const name of Object.keys(files) as Array<keyof typeof files>) {
      files[name] = path.join(dir.path, `${name}.token`);
      await writeFile(files[name], `${OLD}\n`);
    }
    scheduler = await startScheduler({ ip: '127.0.0.90', clusterTokenFile: files.scheduler });
    running.push(scheduler);
    const peer = (ip: string, clusterTokenFile: string) =>
      startPeer({ ip, schedulers: [scheduler.address], insecure: [registry.host], clusterTokenFile });
    first = await peer('127.0.0.91', files.first);
    running.push(first);
    second = await peer('127.0.0.92', files.second);
    running.push(second);
  });

  after(async () => {
    for (const process of running.reverse()) await process.stop().catch(() => undefined);
    await registry?.stop();
    await dir?.remove();
  });

  /** Writes new versions of some files and waits until each of those processes has reloaded its own. */
  async function step(changes: Partial<Record<keyof typeof files, string>>): Promise<void> {
    const services = { scheduler: scheduler.service, first: first.service, second: second.service };
    const before = Object.fromEntries(Object.keys(changes).map((name) => [name, reloads(services[name as keyof typeof files])]));
    for (const [name, text] of Object.entries(changes)) await writeFile(files[name as keyof typeof files], text);
    for (const name of Object.keys(changes) as Array<keyof typeof files>) {
      await waitFor(() => reloads(services[name]) > (before[name] ?? 0), 20_000, `${name} reloading its token file`);
    }
  }

  /** A pull through the first peer, then the second: the second's bytes must come from the first, through the swarm. */
  async function pullThroughTheSwarm(repo: string): Promise<void> {
    const blob = await pushRandomBlob(registry, repo, 8 * MB);
    const fromPeersBefore = await second.metric('starling_peer_downloaded_bytes_total', { source: 'peer' });
    assert.equal((await pullThrough(first, registry, repo, blob.digest)).digest, blob.digest);
    assert.equal((await pullThrough(second, registry, repo, blob.digest)).digest, blob.digest);
    assert.equal(blobBytesSent(registry.requests(), blob.digest), blob.size, `${repo}: the registry sent one copy`);
    const fromPeers = (await second.metric('starling_peer_downloaded_bytes_total', { source: 'peer' })) - fromPeersBefore;
    assert.equal(fromPeers, blob.size, `${repo}: the second peer's bytes came from the first`);
  }

  /** What the first peer's upload port answers a request carrying `token`: 401 when refused. */
  async function uploadAnswers(token: string): Promise<number> {
    const uploadPort = first.options.uploadPort ?? 0;
    const response = await request(`http://127.0.0.91:${uploadPort}/_starling/no-such-endpoint`, {
      headers: { authorization: `Bearer ${token}` },
    });
    await response.body.dump();
    return response.statusCode;
  }

  it('goes from the old token to the new one with pulls through the swarm at every step', async () => {
    await pullThroughTheSwarm('rotation/0-old');
    // Every process accepts the new token before any sends it.
    await step({ scheduler: `${OLD}\n${NEW}\n`, first: `${OLD}\n${NEW}\n`, second: `${OLD}\n${NEW}\n` });
    await pullThroughTheSwarm('rotation/1-both-accepted');
    // Then they start sending it, one at a time: the second peer still sends the old one.
    await step({ scheduler: `${NEW}\n${OLD}\n`, first: `${NEW}\n${OLD}\n` });
    await pullThroughTheSwarm('rotation/2-mixed');
    await step({ second: `${NEW}\n${OLD}\n` });
    // Then the old one goes.
    await step({ scheduler: `${NEW}\n`, first: `${NEW}\n`, second: `${NEW}\n` });
    await pullThroughTheSwarm('rotation/3-new');
    assert.equal(await uploadAnswers(OLD), 401, 'the old token is refused once the rotation is over');
    assert.equal(await uploadAnswers(NEW), 404, 'the new token is taken (and the endpoint does not exist)');
  });

  it('keeps the token in use when its file is edited badly, and says so in the log', async () => {
    await writeFile(files.first, 'short\n');
    await waitFor(() => /cluster token file changed but cannot be used/.test(first.service.readLog()), 20_000, 'the refusal logged');
    assert.match(first.service.readLog(), /shorter than 16 characters/);
    assert.equal(await uploadAnswers(NEW), 404, 'the token in use still works');
    await pullThroughTheSwarm('rotation/4-after-a-bad-edit');
  });
});
