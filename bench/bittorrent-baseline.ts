// The BitTorrent baseline: a swarm nobody here wrote, on the same emulated cluster.
//
//   npx tsx bench/bittorrent-baseline.ts --nodes 8 [--size 16MiB] [--node-rate 20mbit] [--origin-rate 80mbit]
//                                        [--piece-length 64KiB] [--leave-on-complete]
//
// Debian's aria2 (aria2c) as every peer, opentracker as the tracker, mktorrent to make the
// .torrent. The seeder (the origin's role) runs in the origin namespace behind the origin's
// cap; N leechers run in the node namespaces behind the node caps; the tracker has its own
// uncapped namespace. opentracker is Debian's whitelist build: it serves only the info
// hashes listed in its whitelist file (written here), refuses to run as root (-u nobody)
// and chroots into its directory (-d), so the whitelist path is relative to that.
// DHT, LPD and IPv6 are off; peer exchange stays on (aria2's default). Every peer keeps
// seeding until the last node is done (unless --leave-on-complete), as Starling's peers do.
// A node is "done" when aria2 has every piece SHA-1-verified (its --on-bt-download-complete
// hook stamps the time); the file is then checked against its sha256 as well. Every leecher is
// spawned first and waits at a start gate; the time starts when the gate opens, as in
// bench/swarm-cluster.ts (`startSpreadSeconds`: how long after it the last leecher went on).

import { createHash } from 'node:crypto';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { writeRandomFile } from '../test/fixtures/images.js';
import { makeTempDir, runOk, type Service } from '../test/fixtures/processes.js';
import { infoHash } from './lib/bencode.js';
import {
  capOf,
  clusterLowerBound,
  createCluster,
  hostEntry,
  softnetDrops,
  startCpuSampler,
  tcpPayloadBytes,
  type Cluster,
  type Counters,
  type QdiscStats,
} from './lib/cluster.js';
import { startEgressSampler } from './lib/egress.js';
import {
  againstOwnBounds,
  boundLine,
  cpuLine,
  reportJson,
  holdStartGate,
  scenarioArgs,
  startRateChanges,
  startRates,
  summarize,
  warnIfOverBudget,
  type NodeTiming,
} from './lib/scenario.js';
import { parseSize } from '../src/common/units.js';
import { fixed, table } from './lib/stats.js';
import { itemAt } from '../src/common/indexing.js';

const a = scenarioArgs('bittorrent-baseline', {
  'piece-length': {
    type: 'string',
    help: 'BitTorrent piece size, a power of 2 (default: size/256, within 32KiB…4MiB; mktorrent allows 32KiB…256MiB)',
  },
  'leave-on-complete': { type: 'boolean', default: false, help: 'leechers quit when done instead of seeding until all are done' },
  timeout: { type: 'string', help: 'give up after this many seconds (default: max(300, 30 × T*))' },
});
warnIfOverBudget(a);
const F = a.sizeBytes;
const N = a.nodes;
const pieceLog2 = a.extra['piece-length']
  ? Math.log2(parseSize(String(a.extra['piece-length'])))
  : Math.min(22, Math.max(15, Math.round(Math.log2(F / 256))));
if (!Number.isInteger(pieceLog2) || pieceLog2 < 15 || pieceLog2 > 28)
  throw new Error("--piece-length must be a power of 2 between 32KiB and 256MiB (mktorrent's range)");
const TRACKER_PORT = 6969;
const PEER_PORT = 6881;

const work = await makeTempDir('starling-bench-bt-');
let cluster: Cluster | undefined;
try {
  // ------------------------------------------------------------ the file, the torrent, the whitelist
  const seedDir = path.join(work.path, 'seed');
  const name = 'blob.bin';
  const { sha256 } = await writeRandomFile(path.join(seedDir, name), F, `bittorrent-${F}`);
  cluster = await createCluster({ nodes: N, nodeRate: startRates(a.links), originRate: a.originRate, extras: [{ name: 'tracker' }] });
  const c = cluster;
  const tracker = c.host('tracker');
  const announce = `http://${tracker.ip}:${TRACKER_PORT}/announce`;
  const torrent = path.join(work.path, `${name}.torrent`);
  await runOk('mktorrent', ['-a', announce, '-l', String(pieceLog2), '-n', name, '-o', torrent, path.join(seedDir, name)]);
  const hash = infoHash(await fsp.readFile(torrent));
  // opentracker drops to nobody after chrooting into trackerDir: it must be able to get there.
  await fsp.chmod(work.path, 0o755);
  const trackerDir = path.join(work.path, 'tracker');
  await fsp.mkdir(trackerDir, { mode: 0o755 });
  await fsp.writeFile(path.join(trackerDir, 'whitelist'), `${hash}\n`, { mode: 0o644 });

  // ------------------------------------------------------------ tracker and seeder
  const services: Service[] = [];
  services.push(
    await c.spawn(
      tracker,
      'opentracker',
      ['-i', tracker.ip, '-p', String(TRACKER_PORT), '-P', String(TRACKER_PORT), '-u', 'nobody', '-d', trackerDir, '-w', 'whitelist'],
      {
        name: 'opentracker',
        logFile: path.join(work.path, 'logs', 'opentracker.log'),
      },
    ),
  );
  const scrapeUrl = `http://${tracker.ip}:${TRACKER_PORT}/scrape?info_hash=${hash.replace(/../g, '%$&')}`;
  const scrape = async () =>
    (await c.exec(tracker, 'curl', ['-s', '--noproxy', '*', '--max-time', '2', scrapeUrl], { allowFail: true })).stdout;
  const waitScrape = async (what: string, ok: (body: string) => boolean) => {
    for (let i = 0; ; i++) {
      const body = await scrape();
      if (ok(body)) return body;
      if (i > 200) {
        const logs = services.map((x) => `--- ${x.name}:\n${x.logTail(15)}`).join('\n');
        throw new Error(`tracker: ${what} not seen; last scrape: ${JSON.stringify(body)}\n${logs}`);
      }
      await sleep(50);
    }
  };
  await waitScrape('scrape answer', (b) => b.startsWith('d5:files'));

  const aria2Common = [
    '--no-conf=true',
    '--enable-dht=false',
    '--enable-dht6=false',
    '--bt-enable-lpd=false',
    '--disable-ipv6=true',
    `--listen-port=${PEER_PORT}`,
    '--file-allocation=none',
    '--summary-interval=0',
    '--console-log-level=notice',
    '--auto-save-interval=0',
    '--allow-overwrite=true',
    '--bt-stop-timeout=0',
    `--stop-with-process=${process.pid}`, // a safety net: peers die with this process
  ];
  services.push(
    await c.spawn(c.origin, 'aria2c', [...aria2Common, `--dir=${seedDir}`, '--bt-seed-unverified=true', '--seed-ratio=0.0', torrent], {
      name: 'seeder',
      logFile: path.join(work.path, 'logs', 'seeder.log'),
    }),
  );
  await waitScrape('the seeder', (b) => /8:completei[1-9]/.test(b));

  // ------------------------------------------------------------ leechers, all at once
  const hook = path.join(work.path, 'done-hook.sh');
  // aria2 calls it with GID, number of files, path of the first file: stamp the wall clock.
  await fsp.writeFile(hook, '#!/bin/sh\ndate +%s.%N > "$3.done"\n', { mode: 0o755 });
  const seedTerms = a.extra['leave-on-complete'] ? ['--seed-time=0'] : ['--seed-ratio=0.0'];
  const nodeDirs = c.nodes.map((n) => path.join(work.path, 'nodes', n.name));
  for (const d of nodeDirs) await fsp.mkdir(d, { recursive: true });

  const lb = clusterLowerBound(F, c.origin, c.nodes);
  const timeoutS = a.extra.timeout ? Number(a.extra.timeout) : Math.max(300, 30 * lb.seconds);
  const originBefore = await c.counters(c.origin);
  const allBefore = await c.allCounters();
  const qBefore = await c.allDownloadQdiscStats();
  const softnet0 = softnetDrops();
  const egress = await startEgressSampler(c, c.origin);
  // Every leecher is spawned and waits at the gate; the time starts when it opens.
  const gate = await holdStartGate(work.path);
  const leecherLogs = c.nodes.map((n) => path.join(work.path, 'logs', `${n.name}.log`));
  const leechers = await Promise.all(
    c.nodes.map((n, i) =>
      c.spawn(
        n,
        'bash',
        gate.gated('aria2c', [...aria2Common, ...seedTerms, `--dir=${nodeDirs[i]}`, `--on-bt-download-complete=${hook}`, torrent]),
        { name: `leecher-${n.name}`, logFile: itemAt(leecherLogs, i) },
      ),
    ),
  );
  services.push(...leechers);
  let t0: number;
  try {
    t0 = await gate.open(leecherLogs);
  } finally {
    gate.close();
  }
  const cpu = startCpuSampler(500, () => c.cpuSeconds());
  const changes = startRateChanges(c, a.links, t0, () => Date.now() / 1000);

  const done = new Map<string, number>();
  let originAtLast: Counters | undefined;
  let allAtLast: Map<string, Counters> | undefined;
  let qAtLast: Map<string, QdiscStats> | undefined;
  while (done.size < N) {
    for (const [i, node] of c.nodes.entries()) {
      if (done.has(node.name)) continue;
      const stamp = path.join(itemAt(nodeDirs, i), `${name}.done`);
      const leecher = itemAt(leechers, i);
      if (fs.existsSync(stamp)) {
        const text = fs.readFileSync(stamp, 'utf8').trim();
        if (text) done.set(node.name, Number(text) - t0);
      } else if (!leecher.running) {
        throw new Error(`leecher on ${node.name} exited before finishing:\n${leecher.logTail()}`);
      }
    }
    if (done.size === N) {
      originAtLast = await c.counters(c.origin);
      allAtLast = await c.allCounters();
      qAtLast = await c.allDownloadQdiscStats();
      break;
    }
    if (Date.now() / 1000 - t0 > timeoutS) {
      const missing = c.nodes.filter((n) => !done.has(n.name)).map((n) => n.name);
      throw new Error(
        `timed out after ${timeoutS} s; not done: ${missing.join(' ')}; log of ${missing[0]}:\n${leechers[c.nodes.findIndex((n) => n.name === missing[0])]?.logTail() ?? ''}`,
      );
    }
    await sleep(50);
  }
  const cpuReport = cpu.stop();
  const startSpreadSeconds = await gate.spread(leecherLogs, t0);
  const rateChanges = await changes.stop();
  const egressRecord = await egress.stop();
  await Promise.all(services.map((s) => s.stop(2000)));

  // Every node's copy must be the blob.
  for (const [i, node] of c.nodes.entries()) {
    const h = createHash('sha256');
    for await (const chunk of fs.createReadStream(path.join(itemAt(nodeDirs, i), name))) h.update(chunk as Buffer);
    const got = h.digest('hex');
    if (got !== sha256) throw new Error(`${node.name}: sha256 ${got}, expected ${sha256}`);
  }
  // Read when the last node finished; the loop above ends only then (or throws).
  if (!originAtLast || !allAtLast || !qAtLast) throw new Error('the counters were not read when the last node finished');

  // ------------------------------------------------------------ report
  const timings: NodeTiming[] = c.nodes.map((n) => ({ node: n.name, done: hostEntry(done, n.name, 'finishing time') }));
  const s = summarize(timings);
  const own = againstOwnBounds(timings, a.links, F, capOf(c.origin, 'up'));
  const egressWire = originAtLast.txBytes - originBefore.txBytes;
  const egressPayload = tcpPayloadBytes(egressWire, originAtLast.txPackets - originBefore.txPackets);
  // What the nodes uploaded to each other (payload), in copies of the blob.
  let peerPayload = 0;
  let receivedPayload = 0;
  for (const n of c.nodes) {
    const b = hostEntry(allBefore, n.name, 'link counters');
    const e = hostEntry(allAtLast, n.name, 'link counters');
    peerPayload += tcpPayloadBytes(e.txBytes - b.txBytes, e.txPackets - b.txPackets);
    receivedPayload += tcpPayloadBytes(e.rxBytes - b.rxBytes, e.rxPackets - b.rxPackets);
  }
  // Packets that the nodes' download caps dropped (queue full: many peers sending to one node).
  let drops = 0;
  let sent = 0;
  for (const n of c.nodes) {
    const q = hostEntry(qAtLast, n.name, 'qdisc stats');
    const q0 = hostEntry(qBefore, n.name, 'qdisc stats');
    drops += q.drops - q0.drops;
    sent += q.sentPackets - q0.sentPackets;
  }
  const result = {
    kind: 'bittorrent',
    nodes: N,
    sizeBytes: F,
    pieceBytes: 2 ** pieceLog2,
    nodeRate: a.nodeRate,
    rateChanges: a.rateChanges,
    rateChangesInPlace: rateChanges,
    originRate: a.originRate,
    leaveOnComplete: !!a.extra['leave-on-complete'],
    lowerBound: lb,
    firstSeconds: s.first,
    medianSeconds: s.median,
    lastSeconds: s.last,
    ratio: s.last / lb.seconds,
    seederEgressCopies: egressPayload / F,
    seederEgressWireCopies: egressWire / F,
    peerUploadCopies: peerPayload / F,
    /** Payload all nodes received, per node, in copies: > 1 = duplicate pieces and protocol overhead. */
    receivedCopiesPerNode: receivedPayload / F / N,
    downloadQueueDropPct: (100 * drops) / Math.max(1, drops + sent),
    cpu: cpuReport,
    softnetDrops: softnetDrops() - softnet0,
    egress: egressRecord,
    ownBound: own.ownBound,
    perNode: own.perNode,
    startSpreadSeconds,
  };
  console.log(
    `BitTorrent (aria2 ${N} leechers + 1 seeder, opentracker): ${a.sizeText} (${F} B) in ${F / 2 ** pieceLog2} pieces of ${2 ** pieceLog2 / 1024} KiB; ` +
      `nodes ${a.nodeRate}, seeder ${a.originRate}`,
  );
  console.log(boundLine(lb));
  console.log(
    table(
      [
        'scenario',
        'N',
        'size',
        'node',
        'origin',
        'T* s',
        'first s',
        'median s',
        'last s',
        'last/T*',
        'seeder egress (copies)',
        'peer upload (copies)',
      ],
      [
        [
          'bittorrent',
          String(N),
          a.sizeText,
          a.nodeRate,
          a.originRate,
          fixed(lb.seconds),
          fixed(s.first),
          fixed(s.median),
          fixed(s.last),
          fixed(result.ratio),
          `${fixed(result.seederEgressCopies)} (wire ${fixed(result.seederEgressWireCopies)})`,
          fixed(result.peerUploadCopies),
        ],
      ],
    ),
  );
  console.log(
    `nodes received ${fixed(result.receivedCopiesPerNode, 3)} copies each (TCP payload: pieces, duplicates in end-game, protocol messages); ` +
      `their download caps dropped ${fixed(result.downloadQueueDropPct, 2)}% of packets (queues full; retransmitted)`,
  );
  for (const line of own.lines) console.log(line);
  console.log(`every leecher went on within ${fixed(startSpreadSeconds, 3)} s of the start gate`);
  for (const change of rateChanges) console.log(`${change.node}'s link changed at ${fixed(change.inPlace)} s (asked for ${change.at} s)`);
  console.log(
    `per node (s): ${[...timings]
      .sort((x, y) => x.done - y.done)
      .map((t) => `${t.node}=${fixed(t.done, 1)}`)
      .join(' ')}`,
  );
  console.log(cpuLine(cpuReport));
  await reportJson(a, result);
} finally {
  await cluster?.destroy();
  await work.remove();
}
