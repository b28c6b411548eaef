// Benchmark of `starling peer` as a registry mirror, against baselines measured in the same run:
//
//   1. cache hit   — one client reads a blob the peer already holds, vs nginx (sendfile) serving
//                    the same bytes as a static file; ratio peer/nginx throughput (goal ≥ 0.8).
//   2. cold pull   — one client reads the blob through a fresh peer (empty data dir: the peer fetches
//                    from the registry, stores, verifies and streams), vs the same client reading it
//                    straight from the docker-registry; ratio direct_time/mirror_time (goal ≥ 0.9).
//   3. memory      — peak RSS of the peer process while 16 clients read the cached blob at once
//                    (VmRSS sampled every 50 ms and VmHWM; goal ≤ 250 MB); also the aggregate
//                    throughput of those 16 streams vs nginx under the same load.
//
// The client is curl writing to /dev/null for every measurement. The machine is small and shared
// (2 cores), so each comparison alternates the two sides round by round and reports the median of
// per-round ratios. Everything (registry, peers, nginx) is started here on loopback and stopped at
// the end; temp dirs are removed on exit.
//
//   npx tsc -p . && npx tsx bench/peer-mirror.ts [--size 1GB] [--rounds 3] [--streams 16]
//        [--only hit,cold,rss] [--cpu-prof DIR] [--json-out FILE]
//
// --cpu-prof DIR preloads bench/lib/cpu-prof-preload.mjs into every peer (NODE_OPTIONS=--import;
// Node 20 refuses --cpu-prof there) so that each writes a V8 .cpuprofile into DIR when it stops
// (open it in Chrome DevTools, or `npx tsx bench/lib/cpuprofile.ts FILE` for a text summary).

import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { startRegistry } from '../test/fixtures/registry.js';
import { pushRandomBlob } from '../test/fixtures/images.js';
import { startPeer, STARLING_CLI, type RunningPeerProcess } from '../test/fixtures/peer.js';
import { makeTempDir, run, type TempDir } from '../test/fixtures/processes.js';
import { curlGet, type Transfer } from './lib/curl.js';
import { startNginx } from './lib/nginx.js';
import { cpuSeconds, sampleRss, statusBytes } from './lib/proc.js';
import { parseSize } from '../src/common/units.js';
import { fixed, mb, mbps, median, table } from './lib/stats.js';
import { itemAt } from '../src/common/indexing.js';

const GOALS = { hitRatio: 0.8, coldRatio: 0.9, peakRssBytes: 250e6 };
const REPO = 'bench/peer-mirror';

const { values: args } = parseArgs({
  options: {
    size: { type: 'string', default: '1GB' },
    rounds: { type: 'string', default: '3' },
    streams: { type: 'string', default: '16' },
    only: { type: 'string', default: 'hit,cold,rss' },
    'cpu-prof': { type: 'string' },
    'json-out': { type: 'string' },
    'timeout-min': { type: 'string', default: '20' },
  },
});
const SIZE = parseSize(args.size);
const ROUNDS = Math.max(1, Number(args.rounds));
const STREAMS = Math.max(1, Number(args.streams));
const ONLY = new Set(args.only.split(',').map((s) => s.trim()));
const CPU_PROF_DIR = args['cpu-prof'] ? path.resolve(args['cpu-prof']) : undefined;
const CPU_PROF_PRELOAD = fileURLToPath(new URL('./lib/cpu-prof-preload.mjs', import.meta.url));

// The bench stops by itself even if something hangs (the fixtures kill what they started on exit).
const watchdog = setTimeout(
  () => {
    console.error(`peer-mirror bench: gave up after ${args['timeout-min']} minutes`);
    process.exit(2);
  },
  Number(args['timeout-min']) * 60_000,
);
watchdog.unref();

function log(message: string): void {
  process.stderr.write(`[${new Date().toISOString().slice(11, 19)}] ${message}\n`);
}

interface Measured extends Transfer {
  /** CPU seconds the server process(es) used during the transfer. */
  serverCpu: number;
}

/** One curl transfer, with the CPU time `pids` spent meanwhile. */
async function measure(url: string, pids: number[]): Promise<Measured> {
  const cpu0 = pids.reduce((s, p) => s + cpuSeconds(p), 0);
  const t = await curlGet(url, { bytes: SIZE });
  const cpu1 = pids.reduce((s, p) => s + cpuSeconds(p), 0);
  return { ...t, serverCpu: cpu1 - cpu0 };
}

async function launchPeer(dataDir: string, registryHost: string): Promise<RunningPeerProcess> {
  // startPeer passes our environment on to the peer: set it for the spawn only.
  const saved = { NODE_OPTIONS: process.env.NODE_OPTIONS, STARLING_CPU_PROF_DIR: process.env.STARLING_CPU_PROF_DIR };
  if (CPU_PROF_DIR) {
    process.env.NODE_OPTIONS = `${saved.NODE_OPTIONS ?? ''} --import ${CPU_PROF_PRELOAD}`.trim();
    process.env.STARLING_CPU_PROF_DIR = CPU_PROF_DIR;
  }
  try {
    return await startPeer({ dataDir, insecure: [registryHost], extraArgs: ['--log-level', 'info'] });
  } finally {
    for (const [key, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[key];
      else process.env[key] = value;
    }
  }
}

async function machineNotes(): Promise<Record<string, string>> {
  const version = async (cmd: string, a: string[]) => {
    const r = await run(cmd, a).catch(() => undefined);
    return ((r?.stdout || r?.stderr || '').split('\n')[0] ?? '').trim();
  };
  return {
    cpus: `${os.cpus().length} × ${os.cpus()[0]?.model ?? '?'}`,
    memory: `${(os.totalmem() / 2 ** 30).toFixed(0)} GiB`,
    kernel: os.release(),
    node: process.version,
    nginx: await version('/usr/sbin/nginx', ['-v']),
    curl: await version('curl', ['--version']),
    registry: await version('docker-registry', ['--version']),
    network: 'loopback (127.0.0.1)',
  };
}

/** What was measured: the commit, whether the tree had local changes, and when dist/ was built. */
async function buildNotes(): Promise<Record<string, string>> {
  const repo = path.resolve(path.dirname(STARLING_CLI), '../..');
  const git = async (a: string[]) => (await run('git', ['-C', repo, ...a]).catch(() => undefined))?.stdout.trim() ?? '';
  return {
    commit: await git(['rev-parse', '--short', 'HEAD']),
    dirtySrc: (await git(['status', '--porcelain', '--', 'src'])) ? 'yes' : 'no',
    distBuilt: fs.statSync(STARLING_CLI).mtime.toISOString(),
  };
}

async function main(): Promise<void> {
  if (!fs.existsSync(STARLING_CLI)) throw new Error(`${STARLING_CLI} is missing: run \`npx tsc -p .\` first`);
  if (CPU_PROF_DIR) await fsp.mkdir(CPU_PROF_DIR, { recursive: true });
  const notes = await machineNotes();
  const build = await buildNotes();
  const loadStart = os.loadavg();
  log(`size ${SIZE} bytes, ${ROUNDS} rounds, ${STREAMS} streams; ${notes.cpus}`);

  const registry = await startRegistry();
  log(`pushing a ${mb(SIZE)} MB random blob to ${registry.host}`);
  const blob = await pushRandomBlob(registry, REPO, SIZE);
  const nginx = await startNginx({ root: path.dirname(blob.path) });
  const nginxUrl = `${nginx.url}/${path.basename(blob.path)}`;
  const nginxCopyUrl = `${nginx.copyUrl}/${path.basename(blob.path)}`;
  const directUrl = `${registry.url}/v2/${REPO}/blobs/${blob.digest}`;
  const mirrorPath = `/v2/${REPO}/blobs/${blob.digest}?ns=${registry.host}`;
  const nginxPids = () => nginx.workerPids();

  // Warm the page cache for both static copies (and check both servers answer with every byte).
  await curlGet(directUrl, { bytes: SIZE });
  await curlGet(nginxUrl, { bytes: SIZE });

  const result: Record<string, unknown> = { bench: 'peer-mirror', size: SIZE, rounds: ROUNDS, streams: STREAMS, machine: notes, build };
  const rows: string[][] = [];
  const peerDirs: TempDir[] = [];
  let cachedPeer: RunningPeerProcess | undefined;
  let cachedDir: TempDir | undefined;

  // ---------------------------------------------------------------- 2. cold pull
  // Run first: its last fresh peer (with the blob now stored and verified) serves the cache-hit part.
  const cold: Array<{ direct: Measured; mirror: Measured; registryCpuMirror: number; ratio: number }> = [];
  const coldRounds = ONLY.has('cold') ? ROUNDS : 1;
  for (let round = 0; round < coldRounds; round++) {
    const dir = await makeTempDir('starling-bench-peer-');
    peerDirs.push(dir);
    const peer = await launchPeer(dir.path, registry.host);
    const direct = async () => measure(directUrl, [registry.service.pid]);
    const mirror = async () => {
      const reg0 = cpuSeconds(registry.service.pid);
      const m = await measure(`${peer.url}${mirrorPath}`, [peer.service.pid]);
      return { m, regCpu: cpuSeconds(registry.service.pid) - reg0 };
    };
    let d: Measured;
    let m: { m: Measured; regCpu: number };
    if (round % 2 === 0) {
      d = await direct();
      m = await mirror();
    } else {
      m = await mirror();
      d = await direct();
    }
    cold.push({ direct: d, mirror: m.m, registryCpuMirror: m.regCpu, ratio: d.seconds / m.m.seconds });
    if (ONLY.has('cold')) {
      log(
        `cold round ${round + 1}: direct ${mbps(d.speed)} MB/s, mirror ${mbps(m.m.speed)} MB/s (peer CPU ${fixed(m.m.serverCpu)} s), ratio ${fixed(d.seconds / m.m.seconds)}`,
      );
    }
    const stored = await peer.metric('starling_peer_downloaded_bytes_total').catch(() => NaN);
    if (round < coldRounds - 1) {
      await peer.stop();
      await dir.remove();
    } else {
      cachedPeer = peer;
      cachedDir = dir;
      log(`peer ${peer.host} now holds the blob (${mb(stored)} MB downloaded)`);
    }
  }
  // The parts below restart the peer that holds the blob, on its data dir.
  if (!cachedPeer || !cachedDir) throw new Error('the cold pull left no peer holding the blob');
  const blobDir = cachedDir;
  if (ONLY.has('cold')) {
    const ratio = median(cold.map((c) => c.ratio));
    const directSpeed = median(cold.map((c) => c.direct.speed));
    const mirrorSpeed = median(cold.map((c) => c.mirror.speed));
    result.cold = {
      directBytesPerSecond: directSpeed,
      mirrorBytesPerSecond: mirrorSpeed,
      directSeconds: median(cold.map((c) => c.direct.seconds)),
      mirrorSeconds: median(cold.map((c) => c.mirror.seconds)),
      mirrorTtfbSeconds: median(cold.map((c) => c.mirror.ttfbSeconds)),
      peerCpuSeconds: median(cold.map((c) => c.mirror.serverCpu)),
      registryCpuSecondsDirect: median(cold.map((c) => c.direct.serverCpu)),
      ratio,
      ratios: cold.map((c) => c.ratio),
      goal: GOALS.coldRatio,
      pass: ratio >= GOALS.coldRatio,
    };
    rows.push([
      'cold pull: mirror vs registry direct',
      `${mbps(mirrorSpeed)} MB/s`,
      `${mbps(directSpeed)} MB/s`,
      fixed(ratio),
      `≥ ${GOALS.coldRatio}`,
      ratio >= GOALS.coldRatio ? 'pass' : 'FAIL',
    ]);
  }

  // ---------------------------------------------------------------- 1. cache hit
  if (ONLY.has('hit')) {
    // A fresh process on the data dir that holds the blob (its pages are still in the page cache):
    // the hit figures (and a --cpu-prof profile) then cover serving only, not the earlier fetch.
    await cachedPeer.stop();
    cachedPeer = await launchPeer(blobDir.path, registry.host);
    const peer = cachedPeer;
    const peerUrl = `${peer.url}${mirrorPath}`;
    await curlGet(peerUrl, { bytes: SIZE }); // warm-up, not counted
    await curlGet(nginxCopyUrl, { bytes: SIZE }); // warm-up, not counted
    const hits: Array<{ peer: Measured; nginx: Measured; nginxCopy: Measured; ratio: number; copyRatio: number }> = [];
    for (let round = 0; round < ROUNDS; round++) {
      // Alternate the order so that neither side always runs first (the machine's load drifts).
      const order: Array<'nginx' | 'peer' | 'copy'> = round % 2 === 0 ? ['nginx', 'peer', 'copy'] : ['copy', 'peer', 'nginx'];
      const got: Partial<Record<'nginx' | 'peer' | 'copy', Measured>> = {};
      for (const which of order) {
        if (which === 'nginx') got.nginx = await measure(nginxUrl, nginxPids());
        else if (which === 'copy') got.copy = await measure(nginxCopyUrl, nginxPids());
        else got.peer = await measure(peerUrl, [peer.service.pid]);
      }
      const { peer: p, nginx: n, copy: c } = got as Record<'nginx' | 'peer' | 'copy', Measured>;
      hits.push({ peer: p, nginx: n, nginxCopy: c, ratio: p.speed / n.speed, copyRatio: p.speed / c.speed });
      log(
        `hit round ${round + 1}: nginx ${mbps(n.speed)} MB/s (CPU ${fixed(n.serverCpu)} s), nginx sendfile-off ${mbps(c.speed)} MB/s ` +
          `(CPU ${fixed(c.serverCpu)} s), peer ${mbps(p.speed)} MB/s (CPU ${fixed(p.serverCpu)} s), ratio ${fixed(p.speed / n.speed)}`,
      );
    }
    const ratio = median(hits.map((h) => h.ratio));
    const peerSpeed = median(hits.map((h) => h.peer.speed));
    const nginxSpeed = median(hits.map((h) => h.nginx.speed));
    const copySpeed = median(hits.map((h) => h.nginxCopy.speed));
    const copyRatio = median(hits.map((h) => h.copyRatio));
    const perGB = (cpu: number) => cpu / (SIZE / 1e9);
    result.hit = {
      peerBytesPerSecond: peerSpeed,
      nginxBytesPerSecond: nginxSpeed,
      nginxSendfileOffBytesPerSecond: copySpeed,
      peerCpuSecondsPerGB: median(hits.map((h) => perGB(h.peer.serverCpu))),
      nginxCpuSecondsPerGB: median(hits.map((h) => perGB(h.nginx.serverCpu))),
      nginxSendfileOffCpuSecondsPerGB: median(hits.map((h) => perGB(h.nginxCopy.serverCpu))),
      ratio,
      ratios: hits.map((h) => h.ratio),
      ratioToSendfileOff: copyRatio,
      goal: GOALS.hitRatio,
      pass: ratio >= GOALS.hitRatio,
    };
    rows.unshift(
      [
        'cache hit: peer vs nginx (1 client)',
        `${mbps(peerSpeed)} MB/s`,
        `${mbps(nginxSpeed)} MB/s`,
        fixed(ratio),
        `≥ ${GOALS.hitRatio}`,
        ratio >= GOALS.hitRatio ? 'pass' : 'FAIL',
      ],
      ['  reference: peer vs nginx sendfile off', `${mbps(peerSpeed)} MB/s`, `${mbps(copySpeed)} MB/s`, fixed(copyRatio), '(info)', ''],
    );
  }

  // ---------------------------------------------------------------- 3. memory under 16 streams
  if (ONLY.has('rss')) {
    const mem: Array<{
      idleRss: number;
      peakRss: number;
      hwm: number;
      samples: number;
      peerAgg: number;
      nginxAgg: number;
      peerCpu: number;
    }> = [];
    let peer = cachedPeer;
    for (let round = 0; round < ROUNDS; round++) {
      // A fresh process per round, on the data dir that holds the blob: VmHWM then covers this round only.
      await peer.stop();
      peer = await launchPeer(blobDir.path, registry.host);
      const pid = peer.service.pid;
      const peerUrl = `${peer.url}${mirrorPath}`;
      await sleep(200);
      const idleRss = statusBytes(pid, 'VmRSS') ?? NaN;
      const many = async (url: string, pids: number[]) => {
        const cpu0 = pids.reduce((s, p) => s + cpuSeconds(p), 0);
        const started = performance.now();
        await Promise.all(Array.from({ length: STREAMS }, () => curlGet(url, { bytes: SIZE })));
        const seconds = (performance.now() - started) / 1000;
        return { aggregate: (STREAMS * SIZE) / seconds, cpu: pids.reduce((s, p) => s + cpuSeconds(p), 0) - cpu0 };
      };
      const runPeer = async () => {
        const sampler = sampleRss(pid, 50);
        const r = await many(peerUrl, [pid]);
        const { peakRss, samples } = sampler.stop();
        return { ...r, peakRss, samples, hwm: statusBytes(pid, 'VmHWM') ?? NaN };
      };
      let p: Awaited<ReturnType<typeof runPeer>>;
      let n: { aggregate: number };
      if (round % 2 === 0) {
        n = await many(nginxUrl, nginxPids());
        p = await runPeer();
      } else {
        p = await runPeer();
        n = await many(nginxUrl, nginxPids());
      }
      mem.push({
        idleRss,
        peakRss: p.peakRss,
        hwm: p.hwm,
        samples: p.samples,
        peerAgg: p.aggregate,
        nginxAgg: n.aggregate,
        peerCpu: p.cpu,
      });
      log(
        `rss round ${round + 1}: idle ${mb(idleRss)} MB, peak sampled ${mb(p.peakRss)} MB (${p.samples} samples), VmHWM ${mb(p.hwm)} MB; ${STREAMS} streams: peer ${mbps(p.aggregate)} MB/s, nginx ${mbps(n.aggregate)} MB/s`,
      );
    }
    cachedPeer = peer;
    const peak = Math.max(...mem.map((m) => Math.max(m.hwm, m.peakRss)));
    const peakMedian = median(mem.map((m) => Math.max(m.hwm, m.peakRss)));
    const aggRatio = median(mem.map((m) => m.peerAgg / m.nginxAgg));
    result.memory = {
      idleRssBytes: median(mem.map((m) => m.idleRss)),
      peakRssBytesMedian: peakMedian,
      peakRssBytesMax: peak,
      peakOverIdle: peakMedian / median(mem.map((m) => m.idleRss)),
      peerAggregateBytesPerSecond: median(mem.map((m) => m.peerAgg)),
      nginxAggregateBytesPerSecond: median(mem.map((m) => m.nginxAgg)),
      aggregateRatio: aggRatio,
      goalBytes: GOALS.peakRssBytes,
      pass: peak <= GOALS.peakRssBytes,
      rounds: mem,
    };
    rows.push([
      `peak RSS, ${STREAMS} streams (max of rounds)`,
      `${mb(peak)} MB`,
      `idle ${mb(median(mem.map((m) => m.idleRss)))} MB`,
      fixed(peak / GOALS.peakRssBytes),
      `≤ ${mb(GOALS.peakRssBytes)} MB`,
      peak <= GOALS.peakRssBytes ? 'pass' : 'FAIL',
    ]);
    rows.push([
      `${STREAMS} streams aggregate: peer vs nginx`,
      `${mbps(median(mem.map((m) => m.peerAgg)))} MB/s`,
      `${mbps(median(mem.map((m) => m.nginxAgg)))} MB/s`,
      fixed(aggRatio),
      '(info)',
      '',
    ]);
  }

  await cachedPeer?.stop();
  if (CPU_PROF_DIR) log(`CPU profiles in ${CPU_PROF_DIR}`);
  await nginx.stop();
  await registry.stop();
  for (const d of peerDirs) await d.remove();
  await fsp.rm(blob.path, { force: true });

  const loadEnd = os.loadavg();
  result.loadAverage = { start: loadStart, end: loadEnd };
  console.log(`\nstarling peer mirror — ${mb(SIZE)} MB blob, median of ${ROUNDS} alternating rounds, ${notes.cpus}, loopback`);
  console.log(
    `load average (1 min) at start ${fixed(itemAt(loadStart, 0))}, at end ${fixed(itemAt(loadEnd, 0))}; src at ${build.commit}${build.dirtySrc === 'yes' ? ' + local changes' : ''}, dist built ${build.distBuilt}`,
  );
  console.log(table(['measure', 'starling', 'baseline', 'ratio', 'goal', 'result'], rows));
  if (result.cold) {
    const c = result.cold as Record<string, number>;
    console.log(
      `cold pull detail: mirror ${fixed(c.mirrorSeconds ?? NaN)} s (first byte ${fixed(c.mirrorTtfbSeconds ?? NaN, 3)} s, peer CPU ${fixed(c.peerCpuSeconds ?? NaN)} s), direct ${fixed(c.directSeconds ?? NaN)} s`,
    );
  }
  if (result.hit) {
    const h = result.hit as Record<string, number>;
    console.log(
      `cache hit detail: server CPU per GB — peer ${fixed(h.peerCpuSecondsPerGB ?? NaN)} s, nginx ${fixed(h.nginxCpuSecondsPerGB ?? NaN)} s, ` +
        `nginx sendfile off ${fixed(h.nginxSendfileOffCpuSecondsPerGB ?? NaN)} s`,
    );
  }
  const json = JSON.stringify(result);
  console.log(json);
  if (args['json-out']) await fsp.writeFile(args['json-out'], json + '\n');
}

main().then(
  () => process.exit(0),
  (error) => {
    console.error(error);
    process.exit(1);
  },
);
