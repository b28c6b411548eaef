// Lazy start on a cold node over a capped link: how long until `python3 -c 'import json, sqlite3'`
// has run in a container of a realistic image (debootstrap'd Debian bookworm minbase + python3,
// ~260 MB unpacked, one layer), and how many bytes the node fetched by then, for:
//   (i)   full pull, then run: `ctr images pull` (download and unpack the gzip layer into containerd's
//         overlayfs snapshotter), then `ctr run`;
//   (ii)  lazy, unoptimized: the image converted by `starling convert` (no prioritized files, so no
//         prefetch), `ctr-remote images rpull --snapshotter starling` through the node's Starling
//         peer, then `ctr run --snapshotter starling`;
//   (iii) lazy, optimized: the same with the image converted by `starling optimize` (the files the
//         command read at start-up first in the layer, prefetched in one Range request).
//
//   npx tsc -p . && npx tsx bench/lazy-start.ts [--rate 100mbit] [--runs 1] [--background-fetch]
//
// The real programs throughout: docker-registry (distribution 2.8) in the emulated cluster's origin
// namespace, behind its capped NIC; the node in its own network namespace behind a capped NIC (tc,
// both directions) runs the Starling peer (registry mirror), `starling snapshotter` (with its FUSE
// server) and the ctr/ctr-remote clients; containerd 1.6 itself does no network I/O (ctr pulls), so
// it runs in the root namespace and reaches the snapshotter over its unix socket. Every scenario and
// every run starts cold: a new containerd (empty content store and snapshots), a new peer (empty piece
// store) and a new snapshotter (empty chunk cache). Background fetch is off unless --background-fetch,
// so that "fetched" counts only what the start-up asked for.
//
// The rootfs is the one test/snapshotter/debian.test.ts builds and caches in /var/tmp (run that test
// once first); its one-layer OCI image (umoci) is cached next to it in /var/tmp/starling-lazy-start-*.
// Conversion and optimization run every time (they are timed and printed, but not part of the start).
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { startContainerd, writeHostsToml, type Containerd } from '../test/fixtures/containerd.js';
import { makeTempDir, type Service, type TempDir } from '../test/fixtures/processes.js';
import { blobBytesSent } from '../test/fixtures/registry.js';
import { createCluster, type Cluster, type ClusterHost } from './lib/cluster.js';
import { debianImages, firstLayer, recordedPaths, requireRootfs, SUITE, WORKLOAD, type OciLayer } from './lib/debian-image.js';
import { startNsRegistry, type NsRegistry } from './lib/ns-registry.js';
import { fixed, median, table } from './lib/stats.js';
import { itemAt } from '../src/common/indexing.js';

const CLI = path.resolve(import.meta.dirname, '../dist/cli/main.js');
const REPO = 'debian/python';
const PEER = '127.0.4.1:65001';
const SNAPSHOTTER_METRICS = '127.0.4.1:65009';

const { values: flags } = parseArgs({
  options: {
    rate: { type: 'string', default: '100mbit' },
    runs: { type: 'string', default: '1' },
    'background-fetch': { type: 'boolean', default: false },
    only: { type: 'string' },
    'reuse-images': { type: 'boolean', default: false },
    'keep-logs': { type: 'string' },
    help: { type: 'boolean', default: false },
  },
});
if (flags.help) {
  console.log(
    [
      'usage: npx tsx bench/lazy-start.ts [--rate 100mbit] [--runs 1] [--background-fetch] [--only full,lazy,optimized] [--reuse-images] [--keep-logs DIR]',
      "  --rate R            the node's and the registry's NIC cap, both directions (tc units: mbit = 10^6 bit/s)",
      '  --runs N            runs of each scenario (medians are reported)',
      '  --background-fetch  let the snapshotter fetch the rest of the layer in the background (default off)',
      '  --only LIST         run only these scenarios',
      '  --reuse-images      take the converted and optimized images from an earlier run (cached in /var/tmp)',
      '  --keep-logs DIR     copy the peer, snapshotter and FUSE server logs of every scenario there',
    ].join('\n'),
  );
  process.exit(0);
}
const runs = Number(flags.runs);
if (!Number.isInteger(runs) || runs < 1) throw new Error(`--runs must be a positive integer, got ${flags.runs}`);
requireRootfs();

type Scenario = 'full' | 'lazy' | 'optimized';
const ALL_SCENARIOS: Scenario[] = ['full', 'lazy', 'optimized'];
const SCENARIOS = flags.only ? (flags.only.split(',').map((s) => s.trim()) as Scenario[]) : ALL_SCENARIOS;
for (const s of SCENARIOS) if (!ALL_SCENARIOS.includes(s)) throw new Error(`--only: unknown scenario "${s}" (full, lazy, optimized)`);
const TAGS: Record<Scenario, string> = { full: 'plain', lazy: 'esgz', optimized: 'optimized' };
const LABELS: Record<Scenario, string> = {
  full: '(i) full pull, then run',
  lazy: '(ii) lazy, unoptimized',
  optimized: '(iii) lazy, optimized',
};

interface Measurement {
  scenario: Scenario;
  /** Start of the pull until the workload has exited. */
  seconds: number;
  pullSeconds: number;
  runSeconds: number;
  /** What crossed the node's capped NIC (received), Ethernet payload. */
  linkBytes: number;
  /** What the registry's access log says it sent for the layer blob. */
  registryBytes: number;
  /** Lazy scenarios: what the snapshotter fetched through the peer (footer, TOC, prefetch, chunks). */
  snapshotterBytes?: number;
}

/** Curl inside a namespace (the node's services listen on its own loopback). */
async function curl(cluster: Cluster, host: ClusterHost, url: string): Promise<string> {
  return (await cluster.exec(host, 'curl', ['-s', '--noproxy', '*', '--max-time', '10', url], { allowFail: true })).stdout;
}

async function waitUntil(what: string, check: () => Promise<boolean> | boolean, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

function metricSum(text: string, name: string): number {
  let total = 0;
  for (const line of text.split('\n')) {
    const m = /^([a-z_]+)(?:\{[^}]*\})? ([0-9.e+-]+)$/.exec(line);
    if (m && m[1] === name) total += Number(m[2]);
  }
  return total;
}

/** A cold node's Starling side: a new peer and a new snapshotter (and its FUSE server) in the node's namespace. */
async function startStarlingNode(cluster: Cluster, node: ClusterHost, registryHost: string, dir: string) {
  const services: Service[] = [];
  const peer = await cluster.spawn(
    node,
    process.execPath,
    [
      CLI,
      'peer',
      '--data-dir',
      path.join(dir, 'peer'),
      '--mirror-listen',
      PEER,
      '--upload-listen',
      '127.0.4.1:65002',
      '--insecure-registry',
      registryHost,
      '--log-level',
      flags['keep-logs'] ? 'debug' : 'warn',
    ],
    { name: 'peer', logFile: path.join(dir, 'peer.log') },
  );
  services.push(peer);
  await waitUntil('the peer', async () => {
    if (!peer.running) throw new Error(`peer exited:\n${peer.logTail()}`);
    return (await curl(cluster, node, `http://${PEER}/healthz`)).length > 0;
  });
  const configFile = path.join(dir, 'snapshotter.yaml');
  await fsp.writeFile(configFile, `backgroundFetch:\n  enabled: ${flags['background-fetch'] ? 'true' : 'false'}\n`);
  const root = path.join(dir, 'sn-root');
  const socket = path.join(dir, 'sn.sock');
  const sn = await cluster.spawn(
    node,
    process.execPath,
    [
      CLI,
      'snapshotter',
      '--socket',
      socket,
      '--root',
      root,
      '--peer',
      `http://${PEER}`,
      '--metrics-listen',
      SNAPSHOTTER_METRICS,
      '--config',
      configFile,
      '--log-level',
      flags['keep-logs'] ? 'debug' : 'info',
    ],
    { name: 'snapshotter', logFile: path.join(dir, 'snapshotter.log') },
  );
  services.push(sn);
  await waitUntil('the snapshotter', () => {
    if (!sn.running) throw new Error(`snapshotter exited:\n${sn.logTail()}`);
    return sn.readLog().includes('snapshotter ready');
  });
  return {
    socket,
    async fetchedBytes() {
      return metricSum(await curl(cluster, node, `http://${SNAPSHOTTER_METRICS}/metrics`), 'starling_snapshotter_layer_fetched_bytes');
    },
    async stop() {
      for (const service of services.reverse()) await service.stop();
      // The FUSE server outlives the snapshotter by design: stop it (it unmounts what it serves).
      const pid = Number(await fsp.readFile(path.join(root, 'fuse-server.pid'), 'utf8').catch(() => '0'));
      if (pid > 0) {
        try {
          process.kill(pid, 'SIGTERM');
          await waitUntil('the FUSE server to exit', () => !fs.existsSync(`/proc/${pid}`), 15_000).catch(() =>
            process.kill(pid, 'SIGKILL'),
          );
        } catch {
          // already gone
        }
      }
    },
  };
}

async function measure(
  scenario: Scenario,
  cluster: Cluster,
  registry: NsRegistry,
  layer: OciLayer,
  work: TempDir,
  n: number,
): Promise<Measurement> {
  const node = itemAt(cluster.nodes, 0);
  const registryHost = `${registry.host.ip}:${registry.port}`;
  const ref = `${registryHost}/${REPO}:${TAGS[scenario]}`;
  const dir = path.join(work.path, `${scenario}-${n}`);
  await fsp.mkdir(dir);
  const lazy = scenario !== 'full';
  const starlingNode = lazy ? await startStarlingNode(cluster, node, registryHost, dir) : undefined;
  let containerd: Containerd | undefined;
  try {
    containerd = await startContainerd({
      extraConfig: starlingNode
        ? ['[proxy_plugins.starling]', '  type = "snapshot"', `  address = ${JSON.stringify(starlingNode.socket)}`].join('\n')
        : undefined,
    });
    // Lazy: pulls go to the node's peer (the mirror); full: straight to the registry.
    await writeHostsToml(containerd.hostsDir, registryHost, lazy ? `http://${PEER}` : undefined);
    const { address } = containerd;
    const ctr = (cmd: string, args: string[]) =>
      cluster.exec(node, cmd, ['--address', address, '--namespace', 'default', ...args], { timeoutMs: 1_800_000 });
    const registryBefore = blobBytesSent(registry.requests(), layer.digest);
    const before = await cluster.counters(node);
    const t0 = performance.now();
    if (lazy)
      await ctr('ctr-remote', ['images', 'rpull', '--snapshotter', 'starling', '--plain-http', '--hosts-dir', containerd.hostsDir, ref]);
    else await ctr('ctr', ['images', 'pull', '--plain-http', '--hosts-dir', containerd.hostsDir, ref]);
    const t1 = performance.now();
    const runArgs = ['run', '--rm', ...(lazy ? ['--snapshotter', 'starling'] : []), ref, `lazy-start-${scenario}-${n}`, ...WORKLOAD];
    const ran = await ctr('ctr', runArgs);
    const t2 = performance.now();
    if (ran.code !== 0) throw new Error(`${scenario}: the workload failed (${ran.code}): ${ran.stderr}`);
    const after = await cluster.counters(node);
    return {
      scenario,
      seconds: (t2 - t0) / 1000,
      pullSeconds: (t1 - t0) / 1000,
      runSeconds: (t2 - t1) / 1000,
      linkBytes: after.rxBytes - before.rxBytes,
      registryBytes: blobBytesSent(registry.requests(), layer.digest) - registryBefore,
      snapshotterBytes: starlingNode ? await starlingNode.fetchedBytes() : undefined,
    };
  } finally {
    await containerd?.stop();
    await starlingNode?.stop();
    if (flags['keep-logs']) {
      const keep = path.join(flags['keep-logs'], `${scenario}-${n}`);
      await fsp.mkdir(keep, { recursive: true });
      for (const log of ['peer.log', 'snapshotter.log', 'sn-root/fuse-server.log']) {
        await fsp.copyFile(path.join(dir, log), path.join(keep, path.basename(log))).catch(() => {});
      }
    }
  }
}

const work = await makeTempDir('starling-bench-lazy-start-');
let cluster: Cluster | undefined;
let registry: NsRegistry | undefined;
try {
  // ---- images: plain (cached), converted, optimized
  const images = await debianImages(work.path, flags['reuse-images']);
  const { plain, esgz: esgzLayout, optimized: optLayout, convertSeconds, optimizeSeconds } = images;
  const recorded = (await recordedPaths(images.record)).length;
  const layers: Record<Scenario, OciLayer> = {
    full: await firstLayer(plain, 'plain'),
    lazy: await firstLayer(esgzLayout, 'esgz'),
    optimized: await firstLayer(optLayout, 'optimized'),
  };

  // ---- the cluster: the registry behind one capped NIC, the node behind another
  cluster = await createCluster({ nodes: 1, nodeRate: flags.rate, originRate: flags.rate, prefix: `stl-opt-${process.pid}-` });
  registry = await startNsRegistry(cluster, cluster.origin);
  const pushes: Array<[string, string]> = [
    [`oci:${plain}:plain`, 'plain'],
    [`oci:${esgzLayout}:esgz`, 'esgz'],
    [`oci:${optLayout}:optimized`, 'optimized'],
  ];
  for (const [from, tag] of pushes) {
    await cluster.exec(
      cluster.origin,
      'skopeo',
      ['copy', '--quiet', '--dest-tls-verify=false', from, `docker://127.0.0.1:${registry.port}/${REPO}:${tag}`],
      { timeoutMs: 600_000 },
    );
  }

  const results: Measurement[] = [];
  for (let n = 0; n < runs; n++) {
    // Rotate the order so that no scenario always runs first.
    const order = SCENARIOS.map((_, i) => itemAt(SCENARIOS, (i + n) % SCENARIOS.length));
    for (const scenario of order) {
      const m = await measure(scenario, cluster, registry, layers[scenario], work, n);
      console.error(
        `run ${n + 1} ${LABELS[scenario]}: ${fixed(m.seconds)} s (pull ${fixed(m.pullSeconds)} s, run ${fixed(m.runSeconds)} s), link ${(m.linkBytes / 1e6).toFixed(1)} MB`,
      );
      results.push(m);
    }
  }

  const of = (s: Scenario) => results.filter((r) => r.scenario === s);
  const med = (s: Scenario, f: (m: Measurement) => number) => median(of(s).map(f));
  const full = of('full').length ? med('full', (m) => m.seconds) : NaN;
  const mb = (bytes: number) => `${(bytes / 1e6).toFixed(1)} MB`;
  const pct = (bytes: number, s: Scenario) => `${((100 * bytes) / layers[s].size).toFixed(1)}%`;
  console.log(
    `image: Debian ${SUITE} minbase + python3, one layer; compressed: plain ${mb(layers.full.size)}, eStargz ${mb(layers.lazy.size)}, optimized ${mb(layers.optimized.size)} ` +
      `(${recorded} files recorded); link ${flags.rate} both ways (node and registry); background fetch ${flags['background-fetch'] ? 'on' : 'off'}; ${runs} run(s), medians`,
  );
  console.log(
    `workload: ${WORKLOAD.join(' ')}; ` +
      (Number.isNaN(convertSeconds)
        ? 'images reused from an earlier run'
        : `starling convert ${fixed(convertSeconds, 1)} s, starling optimize ${fixed(optimizeSeconds, 1)} s (not part of the start)`),
  );
  console.log(
    table(
      ['scenario', 'start s', 'pull s', 'run s', 'speed-up vs (i)', 'link bytes', '% of image', 'snapshotter fetched', 'registry sent'],
      SCENARIOS.map((s) => {
        const link = med(s, (m) => m.linkBytes);
        const fetched = s === 'full' ? NaN : med(s, (m) => m.snapshotterBytes ?? NaN);
        return [
          LABELS[s],
          fixed(med(s, (m) => m.seconds)),
          fixed(med(s, (m) => m.pullSeconds)),
          fixed(med(s, (m) => m.runSeconds)),
          `${fixed(full / med(s, (m) => m.seconds), 1)}×`,
          mb(link),
          pct(link, s),
          s === 'full' ? '-' : `${mb(fetched)} (${pct(fetched, s)})`,
          mb(med(s, (m) => m.registryBytes)),
        ];
      }),
    ),
  );
  console.log(
    JSON.stringify({
      kind: 'lazy-start',
      rate: flags.rate,
      runs,
      backgroundFetch: flags['background-fetch'],
      layers,
      convertSeconds,
      optimizeSeconds,
      recorded,
      results,
    }),
  );
} finally {
  await registry?.stop().catch(() => {});
  await cluster?.destroy();
  await work.remove();
}
