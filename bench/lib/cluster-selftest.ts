// Checks the emulated cluster: that caps hold (one node down, one node up, a fan-out from
// the origin, a ring where every node sends and receives at once) and that clusters of
// 32 and 64 nodes are created and torn down without leaving anything behind.
//
//   npx tsx bench/lib/cluster-selftest.ts [--nodes 8] [--node-rate 25mbit] [--origin-rate 100mbit]
//                                         [--seconds 8] [--lifecycle 32,64] [--skip-caps]

import fs from 'node:fs';
import { parseArgs } from 'node:util';
import { parseBitRate } from '../../src/common/units.js';
import {
  createCluster,
  listNamespaces,
  softnetDrops,
  startCpuSampler,
  tcpPayloadBytes,
  type Cluster,
  type ClusterHost,
} from './cluster.js';
import { curlFrom, startHttpSource } from './http-source.js';
import { fixed, table } from './stats.js';
import { itemAt } from '../../src/common/indexing.js';

/** Payload share of a full-size frame: 1448 bytes of TCP payload per 1514-byte Ethernet frame. */
const PAYLOAD_SHARE = 1448 / 1514;

const { values: args } = parseArgs({
  options: {
    nodes: { type: 'string', default: '8' },
    'node-rate': { type: 'string', default: '25mbit' },
    'origin-rate': { type: 'string', default: '100mbit' },
    seconds: { type: 'string', default: '8' },
    lifecycle: { type: 'string', default: '32,64' },
    'skip-caps': { type: 'boolean', default: false },
  },
});

interface Row {
  test: string;
  flows: number;
  capMbit: number;
  /** Achieved TCP payload rate (mean over flows), Mbit/s. */
  meanMbit: number;
  minMbit: number;
  maxMbit: number;
}

async function transfer(c: Cluster, pairs: Array<[ClusterHost, ClusterHost]>, bytes: number): Promise<number[]> {
  // pairs: [client, server]; every server runs a source on port 8080 (started by caller).
  const results = await Promise.all(pairs.map(([client, server]) => curlFrom(c, client, `http://${server.ip}:8080/${bytes}`)));
  return results.map((r) => {
    if (r.bytes !== bytes) throw new Error(`short transfer: ${r.bytes} of ${bytes}`);
    return (8 * r.bytes) / r.seconds / 1e6;
  });
}

function row(test: string, capBits: number, mbits: number[]): Row {
  return {
    test,
    flows: mbits.length,
    capMbit: capBits / 1e6,
    meanMbit: mbits.reduce((a, b) => a + b, 0) / mbits.length,
    minMbit: Math.min(...mbits),
    maxMbit: Math.max(...mbits),
  };
}

async function checkCaps(): Promise<void> {
  const N = Number(args.nodes);
  const nodeBits = parseBitRate(args['node-rate']);
  const originBits = parseBitRate(args['origin-rate']);
  const secs = Number(args.seconds);
  const t0 = Date.now();
  const c = await createCluster({ nodes: N, nodeRate: args['node-rate'], originRate: args['origin-rate'] });
  console.log(`cluster ${c.prefix}: ${N} nodes + origin created in ${Date.now() - t0} ms`);
  const rows: Row[] = [];
  const cpu: Record<string, number> = {};
  const softnet0 = softnetDrops();
  try {
    await startHttpSource(c, c.origin);
    await Promise.all(c.nodes.map((n) => startHttpSource(c, n)));
    const sized = (bits: number) => Math.round((bits / 8) * secs);
    const measure = async (name: string, cap: number, pairs: Array<[ClusterHost, ClusterHost]>, bytes: number) => {
      const s = startCpuSampler();
      rows.push(row(name, cap, await transfer(c, pairs, bytes)));
      cpu[name] = s.stop().meanBusyPct;
    };
    const n0 = itemAt(c.nodes, 0);
    await measure('node download (origin → n0)', nodeBits, [[n0, c.origin]], sized(nodeBits));
    await measure('node upload (n0 → origin)', nodeBits, [[c.origin, n0]], sized(nodeBits));
    {
      // A cap changed mid-transfer (setRate, what --rate-change does): n0's link drops to a
      // quarter halfway through. Half the bytes at the full rate, half at a quarter: 2.5 × as long,
      // an effective rate of 0.4 × the cap.
      const name = 'rate change (n0 to 1/4 halfway)';
      const s0 = startCpuSampler();
      const timer = setTimeout(() => void c.setRate(n0, { up: nodeBits / 4, down: nodeBits / 4 }), ((secs / 2) * 1000) / PAYLOAD_SHARE);
      rows.push(row(name, 0.4 * nodeBits, await transfer(c, [[n0, c.origin]], sized(nodeBits))));
      clearTimeout(timer);
      await c.setRate(n0, { up: nodeBits, down: nodeBits });
      cpu[name] = s0.stop().meanBusyPct;
    }
    // Fan-out: every node pulls from the origin; the aggregate is capped by the origin's upload.
    const fanBytes = sized(Math.min(originBits / N, nodeBits));
    const s = startCpuSampler();
    const t1 = Date.now();
    const fan = await transfer(
      c,
      c.nodes.map((n) => [n, c.origin]),
      fanBytes,
    );
    const wall = (Date.now() - t1) / 1000;
    const fanCpu = s.stop().meanBusyPct;
    cpu['fan-out'] = fanCpu;
    rows.push(row(`fan-out per node (origin → ${N} nodes)`, Math.min(originBits / N, nodeBits), fan));
    rows.push({
      ...row(`fan-out aggregate (origin upload)`, Math.min(originBits, N * nodeBits), [(8 * fanBytes * N) / wall / 1e6]),
      flows: N,
    });
    cpu['fan-out aggregate (origin upload)'] = fanCpu;
    cpu[`fan-out per node (origin → ${N} nodes)`] = fanCpu;
    if (N >= 2) {
      await measure(
        `ring (n[i] ← n[i+1], all at once)`,
        nodeBits,
        c.nodes.map((n, i) => [n, itemAt(c.nodes, (i + 1) % N)]),
        sized(nodeBits),
      );
      // Fan-in: n0 pulls from every other node at once; n0's download cap binds.
      const k = N - 1;
      const s2 = startCpuSampler();
      const t2 = Date.now();
      const samples: Array<[number, number]> = [];
      const poll = setInterval(() => {
        const t = Date.now();
        void c.counters(n0).then((x) => samples.push([t, tcpPayloadBytes(x.rxBytes, x.rxPackets)]));
      }, 250);
      await transfer(
        c,
        c.nodes.slice(1).map((n) => [n0, n]),
        sized(nodeBits / k),
      );
      clearInterval(poll);
      const wall2 = (Date.now() - t2) / 1000;
      const name = `fan-in aggregate (n0 ← ${k} nodes)`;
      const fanInCpu = s2.stop().meanBusyPct;
      cpu[name] = fanInCpu;
      rows.push({ ...row(name, nodeBits, [(8 * sized(nodeBits / k) * k) / wall2 / 1e6]), flows: k });
      // Steady state: n0's received payload between 20% and 80% of the transfer.
      const at = (f: number) =>
        samples.reduce((best, x) => (Math.abs(x[0] - (t2 + f * wall2 * 1000)) < Math.abs(best[0] - (t2 + f * wall2 * 1000)) ? x : best));
      const [a, b] = [at(0.2), at(0.8)];
      const steady = b[0] > a[0] ? (8 * (b[1] - a[1])) / ((b[0] - a[0]) / 1000) / 1e6 : NaN;
      const name2 = `fan-in steady state (20–80% of the time)`;
      cpu[name2] = fanInCpu;
      rows.push({ ...row(name2, nodeBits, [steady]), flows: k });
    }
    if (N >= 3) {
      // Mesh: every node pulls from its next m nodes at once, so every NIC is full both ways
      // (the traffic pattern of a swarm). Per-node download rate = sum of its flows.
      const m = Math.min(4, N - 1);
      const pairs: Array<[ClusterHost, ClusterHost]> = [];
      for (let i = 0; i < N; i++) for (let j = 1; j <= m; j++) pairs.push([itemAt(c.nodes, i), itemAt(c.nodes, (i + j) % N)]);
      const bytes = sized(nodeBits / m);
      const s3 = startCpuSampler();
      const per = await transfer(c, pairs, bytes);
      const name = `mesh (each node ← ${m} others), per node`;
      cpu[name] = s3.stop().meanBusyPct;
      // A node's rate: its m flows ran in parallel; their bytes over the longest one's time.
      const perNode = c.nodes.map((_, i) => {
        const mine = per.slice(i * m, i * m + m).map((mbit) => (8 * bytes) / mbit / 1e6); // seconds of each flow
        return (8 * bytes * m) / Math.max(...mine) / 1e6;
      });
      rows.push(row(name, nodeBits, perNode));
    }
  } finally {
    await c.destroy();
  }
  const softnet = softnetDrops() - softnet0;
  console.log(
    table(
      ['test', 'flows', 'cap Mbit/s', 'ideal payload', 'mean', 'min', 'max', 'mean/ideal', 'CPU %'],
      rows.map((r) => [
        r.test,
        String(r.flows),
        fixed(r.capMbit, 1),
        fixed(r.capMbit * PAYLOAD_SHARE, 2),
        fixed(r.meanMbit, 2),
        fixed(r.minMbit, 2),
        fixed(r.maxMbit, 2),
        fixed(r.meanMbit / (r.capMbit * PAYLOAD_SHARE), 3),
        fixed(cpu[r.test] ?? NaN, 0),
      ]),
    ),
  );
  console.log('(ideal payload = cap × 1448/1514: the TCP payload in full-size Ethernet frames; tc caps count whole frames)');
  console.log(`shared receive backlog drops during the checks (whole machine): ${softnet}`);
  console.log(
    JSON.stringify({
      kind: 'cluster-caps',
      nodes: N,
      nodeRate: args['node-rate'],
      originRate: args['origin-rate'],
      rows,
      cpu,
      softnetDrops: softnet,
    }),
  );
}

function rootLinks(): string[] {
  return fs.readdirSync('/sys/class/net').sort();
}

async function checkLifecycle(sizes: number[]): Promise<void> {
  const before = rootLinks();
  for (const n of sizes) {
    const t0 = Date.now();
    const c = await createCluster({ nodes: n, seed: true, extras: [{ name: 'tracker' }] });
    const created = Date.now() - t0;
    const nsCount = listNamespaces(c.prefix).length;
    // Every node reaches the origin and its neighbour; counters and qdiscs are readable.
    const probes = await Promise.all(
      c.nodes.map((h, i) =>
        c.exec(
          h,
          'curl',
          ['-s', '-o', '/dev/null', '--connect-timeout', '3', '-w', '%{http_code}', `http://${itemAt(c.nodes, (i + 1) % n).ip}:1/`],
          { allowFail: true },
        ),
      ),
    );
    // Connection refused (curl exit 7) proves the packet got there and back (RST).
    const reached = probes.filter((p) => p.code === 7).length;
    const counters = await c.allCounters();
    const q = await c.qdiscStats(itemAt(c.nodes, n - 1));
    const t1 = Date.now();
    await c.destroy();
    const destroyed = Date.now() - t1;
    const left = listNamespaces(c.prefix).length;
    console.log(
      `lifecycle ${n} nodes: ${nsCount} namespaces (hub + origin + seed + tracker + nodes) created in ${created} ms; ` +
        `${reached}/${n} nodes reached their neighbour; counters for ${counters.size} hosts; caps up=${q.up ? 'ok' : 'missing'} down=${q.down ? 'ok' : 'missing'}; ` +
        `destroyed in ${destroyed} ms; ${left} namespaces left`,
    );
    if (reached !== n || left !== 0 || !q.up || !q.down) throw new Error(`lifecycle check failed for ${n} nodes`);
  }
  const after = rootLinks();
  console.log(
    `root namespace links before/after: ${before.join(',')} / ${after.join(',')} (${before.join() === after.join() ? 'unchanged' : 'CHANGED'})`,
  );
}

if (!args['skip-caps']) await checkCaps();
const sizes = args.lifecycle.split(',').filter(Boolean).map(Number);
if (sizes.length) await checkLifecycle(sizes);
