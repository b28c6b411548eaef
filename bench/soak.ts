// A bounded soak of a swarm on loopback: a scheduler, a seed and a few peers serve thousands of
// pulls (whole blobs and ranges) of many blobs from a registry that fails part of the time (500s,
// connections cut part-way, wrong bytes in ranges), while peers are restarted now and then and
// small disk quotas keep eviction busy. A share of the pulls name a second registry holding the same
// blobs (as much a liar), so a peer often holds a copy fetched from the other one: those requests are
// misses for the registry they name, verified before any byte is served. Every byte a client
// receives is checked: a whole blob against its digest, a range against the blob's bytes.
//
//   npx tsc -p . && npx tsx bench/soak.ts [--minutes 3] [--peers 3] [--blobs 60] [--clients 8] [--failure-rate 0.1] [--second-registry 0.15]
//
// Prints requests served, errors by kind, bytes verified (and any byte that was wrong: the one
// figure that must be 0), and each process's RSS and open file descriptors over time.

import { createHash, randomInt } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';
import { request } from 'undici';
import { startLyingRegistry, type Lies } from '../test/fixtures/lying-registry.js';
import { startPeer, startScheduler, type RunningPeerProcess } from '../test/fixtures/peer.js';
import { fixed, table } from './lib/stats.js';
import { itemAt } from '../src/common/indexing.js';

const { values } = parseArgs({
  options: {
    minutes: { type: 'string', default: '3' },
    peers: { type: 'string', default: '3' },
    blobs: { type: 'string', default: '60' },
    clients: { type: 'string', default: '8' },
    'failure-rate': { type: 'string', default: '0.1' },
    'restart-every': { type: 'string', default: '20' },
    'second-registry': { type: 'string', default: '0.15' },
  },
  strict: true,
});
const durationMs = Number(values.minutes) * 60_000;
const failureRate = Number(values['failure-rate']);

interface Sample {
  at: number;
  name: string;
  rssMb: number;
  fds: number;
}

async function sample(name: string, pid: number, at: number): Promise<Sample | undefined> {
  try {
    const status = await readFile(`/proc/${pid}/status`, 'utf8');
    const rss = Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1] ?? 0) / 1024;
    return { at, name, rssMb: rss, fds: (await readdir(`/proc/${pid}/fd`)).length };
  } catch {
    return undefined; // restarting
  }
}

async function main(): Promise<void> {
  const registry = await startLyingRegistry('127.0.80.1');
  const second = await startLyingRegistry('127.0.80.4');
  const blobs = Array.from({ length: Number(values.blobs) }, () => registry.add({ size: randomInt(64 * 1024, 12 * 1024 * 1024) }));
  for (const blob of blobs) second.add({ bytes: blob.bytes });
  const secondShare = Number(values['second-registry']);
  // Failures the registry throws in part of the time, one kind per failing GET.
  const failures: Array<(size: number) => Lies> = [
    () => ({ getStatus: 500 }),
    (size) => ({ resetAfter: Math.floor(size / 3) }),
    () => ({ wrongBytes: 'always' }),
  ];
  const chaos = (digest: string) => {
    if (Math.random() >= failureRate) return undefined;
    const size = blobs.find((b) => b.digest === digest)?.bytes.length ?? 1;
    return itemAt(failures, randomInt(failures.length))(size);
  };
  registry.chaos(chaos);
  second.chaos(chaos);

  const scheduler = await startScheduler({ ip: '127.0.80.2', extraArgs: ['--log-level', 'warn'] });
  const quota = ['--quota', '150MB', '--log-level', 'warn'];
  const seed = await startPeer({
    ip: '127.0.80.3',
    schedulers: [scheduler.address],
    seed: true,
    insecure: [registry.host, second.host],
    extraArgs: quota,
  });
  const peers: RunningPeerProcess[] = [];
  for (let i = 0; i < Number(values.peers); i++) {
    peers.push(
      await startPeer({
        ip: `127.0.80.${10 + i}`,
        schedulers: [scheduler.address],
        insecure: [registry.host, second.host],
        extraArgs: quota,
      }),
    );
  }

  const outcomes = new Map<string, number>();
  const count = (kind: string) => outcomes.set(kind, (outcomes.get(kind) ?? 0) + 1);
  let verifiedBytes = 0;
  let wrongBytes = 0;
  let relayedLies = 0;
  const samples: Sample[] = [];
  const started = Date.now();
  const end = started + durationMs;
  const down = new Set<number>();

  const client = async () => {
    while (Date.now() < end) {
      const which = randomInt(peers.length);
      if (down.has(which)) {
        await sleep(50);
        continue;
      }
      const peer = itemAt(peers, which);
      const blob = itemAt(blobs, randomInt(blobs.length));
      const size = blob.bytes.length;
      const ranged = Math.random() < 0.3;
      const named = Math.random() < secondShare ? second : registry;
      const start = ranged ? randomInt(size) : 0;
      const stop = ranged ? Math.min(size - 1, start + randomInt(1, 2 * 1024 * 1024)) : size - 1;
      try {
        const response = await request(`${peer.url}/v2/soak/blob/blobs/${blob.digest}?ns=${named.host}`, {
          headers: ranged ? { range: `bytes=${start}-${stop}` } : {},
          headersTimeout: 60_000,
          bodyTimeout: 60_000,
        });
        const body = Buffer.from(await response.body.arrayBuffer().catch(() => new ArrayBuffer(0)));
        if (response.statusCode !== 200 && response.statusCode !== 206) {
          count(`HTTP ${response.statusCode}`);
          continue;
        }
        const expected = stop - start + 1;
        if (body.length !== expected) {
          count('cut short');
          continue;
        }
        const good = ranged
          ? body.equals(blob.bytes.subarray(start, stop + 1))
          : `sha256:${createHash('sha256').update(body).digest('hex')}` === blob.digest;
        if (!good && ranged && isInverted(body, blob.bytes.subarray(start, stop + 1))) {
          // The registry's lie (it inverts the bytes), relayed to the range request whose own
          // fetch it answered: what that registry told this client. Never kept as good.
          relayedLies += body.length;
          count('range: the registry lied to this request');
          continue;
        }
        if (!good) {
          wrongBytes += body.length;
          count(ranged ? 'WRONG BYTES (range)' : 'WRONG BYTES (whole blob)');
          continue;
        }
        verifiedBytes += body.length;
        count(`${ranged ? 'range ok' : 'blob ok'}${named === second ? ' (second registry)' : ''}`);
      } catch (error) {
        count(
          down.has(which) ? 'peer restarting' : `error: ${(error as Error).message.replace(/\d+\.\d+\.\d+\.\d+:\d+/, 'PEER').slice(0, 40)}`,
        );
        await sleep(50);
      }
    }
  };

  const restarter = async () => {
    const every = Number(values['restart-every']) * 1000;
    while (Date.now() + every < end) {
      await sleep(every);
      const which = randomInt(peers.length);
      down.add(which);
      const stopped = itemAt(peers, which);
      await stopped.stop();
      peers[which] = await stopped.restart();
      down.delete(which);
      count('peer restarts');
    }
  };

  const sampler = async () => {
    while (Date.now() < end) {
      const at = Math.round((Date.now() - started) / 1000);
      const all = [
        ['scheduler', scheduler.service.pid],
        ['seed', seed.service.pid],
        ...peers.map((p, i) => [`peer ${i}`, p.service.pid]),
      ] as Array<[string, number]>;
      for (const [name, pid] of all) {
        const s = await sample(name, pid, at);
        if (s) samples.push(s);
      }
      await sleep(10_000);
    }
  };

  await Promise.all([...Array.from({ length: Number(values.clients) }, client), restarter(), sampler()]);
  const names = [...new Set(samples.map((s) => s.name))];
  const times = [...new Set(samples.map((s) => s.at))];
  const pick = (name: string, at: number) => samples.find((s) => s.name === name && s.at === at);
  console.log(
    table(
      ['t (s)', ...names.map((n) => `${n} RSS MB / fds`)],
      times.map((at) => [
        String(at),
        ...names.map((n) => {
          const s = pick(n, at);
          return s ? `${fixed(s.rssMb, 0)} / ${s.fds}` : '-';
        }),
      ]),
    ),
  );
  const total = [...outcomes.entries()].filter(([k]) => k !== 'peer restarts').reduce((sum, [, n]) => sum + n, 0);
  console.log(
    `\n${total} requests in ${fixed((Date.now() - started) / 60_000, 1)} min against ${blobs.length} blobs (${Number(values.peers)} peers, a seed, failure rate ${failureRate}):`,
  );
  console.log(
    table(
      ['outcome', 'count'],
      [...outcomes.entries()].sort((a, b) => b[1] - a[1]).map(([k, n]) => [k, String(n)]),
    ),
  );
  console.log(
    `\nbytes delivered and verified: ${verifiedBytes}; wrong bytes delivered as good: ${wrongBytes}; a registry's range lies relayed to the request they answered: ${relayedLies}`,
  );
  for (const [name, service] of [
    ['scheduler', scheduler.service],
    ['seed', seed.service],
    ...peers.map((p, i) => [`peer ${i}`, p.service] as const),
  ] as const) {
    if (!service.running) console.log(`${name} exited: ${JSON.stringify(service.exitInfo)}`);
  }
  // Blobs spooled for their digest check are deleted once served: none may be left behind.
  for (const [name, peer] of [['seed', seed], ...peers.map((p, i) => [`peer ${i}`, p] as const)] as const) {
    const left = await readdir(join(peer.dataDir, 'spool')).catch(() => []);
    console.log(`${name}: ${left.length} spooled files left`);
  }
  for (const process of [...peers.reverse(), seed, scheduler]) await process.stop().catch(() => undefined);
  await registry.stop();
  await second.stop();
  if (wrongBytes > 0) process.exitCode = 1;
}

/** Every byte that differs is the registry's inverted one (a range may mix its lie with verified pieces). */
function isInverted(body: Buffer, expected: Buffer): boolean {
  if (body.length !== expected.length) return false;
  for (const [i, byte] of body.entries()) if (byte !== expected[i] && (byte ^ 0xff) !== expected[i]) return false;
  return true;
}

await main();
