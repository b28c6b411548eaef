// The rows of the seed experiment, run end to end on an emulated cluster: every node pulls the image
// and runs its workload with its own containerd, and a node is ready when the workload's ready line
// comes out of `ctr run`. Shared by bench/e2e-cluster.ts and the small version in test/e2e/.
//
//   (a) direct: `ctr images pull` straight from the registry, then `ctr run`;
//   (b) P2P: the plain image through the node's Starling peer (the swarm), then `ctr run`;
//   (c) P2P + lazy: the eStargz image, `ctr-remote images rpull` into the Starling snapshotter, which
//       reads through the node's peer (so through the swarm), then `ctr run --snapshotter starling`;
//   (d) lazy without P2P: the same, the snapshotter reading the registry itself (no peer, no swarm:
//       what stargz-snapshotter alone does).
// `c-no-bg` is (c) with the snapshotter's background fetch off: the start that nothing competes with.
import fsp from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { createCluster, nowSeconds, startCpuSampler, tcpPayloadBytes, type Cluster, type Counters, type CpuReport } from './cluster.js';
import type { WorkloadImage } from './e2e-image.js';
import { startNodeStack, type NodeStack } from './e2e-node.js';
import { startProgramCpuSampler, withDescendants } from './proc.js';
import { startEgressSampler, type EgressSampler } from './egress.js';
import { startNsRegistry, type NsRegistry } from './ns-registry.js';
import { armGated, startSpread, summarize } from './scenario.js';
import { MIRROR, startSwarm, type Swarm } from './swarm.js';
import { itemAt } from '../../src/common/indexing.js';

export type RowName = 'a' | 'b' | 'c' | 'c-no-bg' | 'd';

const REPO = 'e2e/app';

interface RowSpec {
  label: string;
  image: 'plain' | 'lazy';
  /** Pulls go through each node's peer (a swarm with a scheduler and a seed). */
  swarm: boolean;
  /** Lazy rows: where the snapshotter reads blobs, and whether it fetches the rest in the background. */
  lazy?: { from: 'peer' | 'registry'; backgroundFetch: boolean };
}

export const ROWS: Record<RowName, RowSpec> = {
  a: { label: '(a) direct pull', image: 'plain', swarm: false },
  b: { label: '(b) P2P', image: 'plain', swarm: true },
  c: { label: '(c) P2P + lazy', image: 'lazy', swarm: true, lazy: { from: 'peer', backgroundFetch: true } },
  'c-no-bg': { label: '(c) P2P + lazy, no background fetch', image: 'lazy', swarm: true, lazy: { from: 'peer', backgroundFetch: false } },
  d: { label: '(d) lazy, no P2P', image: 'lazy', swarm: false, lazy: { from: 'registry', backgroundFetch: true } },
};

export function parseRows(text: string): RowName[] {
  const rows = text
    .split(',')
    .map((r) => r.trim())
    .filter(Boolean);
  for (const row of rows) if (!(row in ROWS)) throw new Error(`unknown row "${row}" (rows: ${Object.keys(ROWS).join(', ')})`);
  if (rows.length === 0) throw new Error('no rows given');
  return rows as RowName[];
}

export interface E2eContext {
  cluster: Cluster;
  registry: NsRegistry;
  image: WorkloadImage;
  /** Full references of the two images in the registry. */
  refs: { plain: string; lazy: string };
  /** Each row gets a folder here (its nodes' state and every log). */
  workDir: string;
  /** Extra `starling scheduler` flags (e.g. ['--shape', 'pipeline']). */
  schedulerArgs?: string[];
  /** Extra `starling peer` flags for the seed and every node's peer (e.g. ['--log-level', 'debug']). */
  peerArgs?: string[];
  /** More YAML for every node's snapshotter (not backgroundFetch, which the row sets). */
  snapshotterConfig?: string;
  /** How long to wait, after the last ready line, for every lazy node to hold the whole image. */
  wholeImageTimeoutMs?: number;
  log?: (line: string) => void;
}

export interface NodeResult {
  node: string;
  /** Seconds from "pull requested on every node" to the pull command's end. */
  pulledSeconds: number;
  /** … to the workload's ready line. */
  readySeconds: number;
  /** … to the node holding every layer whole (after the pull for plain rows; background fetch for lazy ones). */
  wholeImageSeconds?: number;
  /** What the node's NIC had received (TCP payload) when its ready line came. */
  readBytes: number;
  /** What its directories held on disk (containerd, snapshotter, peer store) when its ready line came. */
  diskBytes: number;
  /** The same two at the end of the row (lazy rows: after the background fetch). */
  finalReadBytes: number;
  finalDiskBytes: number;
}

export interface RowResult {
  row: RowName;
  label: string;
  image: 'plain' | 'lazy';
  /** Bytes one node needs to start: the whole plain image, or (lazy) the prefetch ranges, TOCs and footers. */
  neededBytes: number;
  /** Compressed size of the image the row pulls. */
  imageBytes: number;
  nodeLinkBitsPerSecond: number;
  firstSeconds: number;
  medianSeconds: number;
  lastSeconds: number;
  /** The latest any node's pull began after the start gate opened (armGated). */
  startSpreadSeconds: number;
  /** What the registry's NIC sent (TCP payload) until the last ready line, and in copies of neededBytes. */
  registryBytes: number;
  registryCopies: number;
  /** … until the end of the row (lazy rows: after every node holds the whole image). */
  registryBytesTotal: number;
  registryPeakBitsPerSecond: number;
  /** Per node, in node order. */
  readBytesPerNode: number[];
  diskBytesPerNode: number[];
  /** When the last node held the whole image (undefined: a lazy row without background fetch). */
  lastWholeImageSeconds?: number;
  nodes: NodeResult[];
  /** Registry NIC egress: [seconds from the start, payload bytes since the start]. */
  egressSamples: Array<[number, number]>;
  /** The machine's CPU from the start to the last ready line, and after it (the background fetch). */
  cpu: CpuReport;
  /** CPU seconds of the cluster's processes (containers included) by program, from the start to the last ready line. */
  cpuSecondsByProgram: Record<string, number>;
  cpuAfterReady?: CpuReport;
}

let runCounter = 0;

export interface E2eClusterOptions {
  nodes: number;
  nodeRate: string;
  /** The registry's NIC and the seed's. */
  originRate: string;
  workDir: string;
}

/**
 * The cluster the rows run on: N nodes, a registry host (docker-registry, holding both images as
 * `e2e/app:plain` and `e2e/app:lazy`), a seed host and a scheduler host (`sched`).
 */
export async function startE2eCluster(
  image: WorkloadImage,
  o: E2eClusterOptions,
): Promise<
  Omit<E2eContext, 'log' | 'schedulerArgs' | 'peerArgs' | 'snapshotterConfig' | 'wholeImageTimeoutMs'> & { stop(): Promise<void> }
> {
  const cluster = await createCluster({
    nodes: o.nodes,
    nodeRate: o.nodeRate,
    originRate: o.originRate,
    seed: { rate: o.originRate },
    extras: [{ name: 'sched' }],
  });
  let registry: NsRegistry | undefined;
  try {
    registry = await startNsRegistry(cluster, cluster.origin);
    const registryHost = `${cluster.origin.ip}:${registry.port}`;
    const refs = { plain: `${registryHost}/${REPO}:plain`, lazy: `${registryHost}/${REPO}:lazy` };
    for (const [layout, tag] of [
      [image.plain.layout, image.plain.tag],
      [image.lazy.layout, image.lazy.tag],
    ] as const) {
      // Over the registry's own loopback: the push costs no capped link and no counted egress.
      await cluster.exec(
        cluster.origin,
        'skopeo',
        ['copy', '--quiet', '--dest-tls-verify=false', `oci:${layout}:${tag}`, `docker://127.0.0.1:${registry.port}/${REPO}:${tag}`],
        { timeoutMs: 600_000 },
      );
    }
    const r = registry;
    return {
      cluster,
      registry,
      image,
      refs,
      workDir: o.workDir,
      async stop() {
        await r.stop().catch(() => {});
        await cluster.destroy();
      },
    };
  } catch (error) {
    await registry?.stop().catch(() => {});
    await cluster.destroy();
    throw error;
  }
}

/** Runs one row on fresh nodes (new containerd, snapshotter and peer state everywhere); throws if any node fails. */
export async function runRow(ctx: E2eContext, row: RowName): Promise<RowResult> {
  const spec = ROWS[row];
  const c = ctx.cluster;
  const log = ctx.log ?? (() => {});
  const rowDir = path.join(ctx.workDir, `${row}-${++runCounter}`);
  await fsp.mkdir(rowDir, { recursive: true });
  const registryHost = `${c.origin.ip}:${ctx.registry.port}`;
  const ref = spec.image === 'plain' ? ctx.refs.plain : ctx.refs.lazy;
  const layers = spec.image === 'plain' ? ctx.image.plain.layers : ctx.image.lazy.layers;

  let swarm: Swarm | undefined;
  const nodes: NodeStack[] = [];
  let egress: EgressSampler | undefined;
  try {
    if (spec.swarm)
      swarm = await startSwarm(c, {
        registryHost,
        workDir: rowDir,
        schedulerArgs: ctx.schedulerArgs,
        peerArgs: ctx.peerArgs,
        seedArgs: ctx.peerArgs,
      });
    nodes.push(...(await startNodes(ctx, spec, rowDir, registryHost)));
    const nodeDirs = (node: NodeStack) => (swarm ? [swarm.dataDir(node.host)] : []);

    const base = await c.allCounters();
    const received = (now: Counters | undefined, name: string) => {
      const b = base.get(name);
      if (!now || !b) throw new Error(`no link counters for ${name}`);
      return tcpPayloadBytes(now.rxBytes - b.rxBytes, now.rxPackets - b.rxPackets);
    };
    const registrySent = async () => {
      const now = await c.counters(c.origin);
      const b = base.get(c.origin.name);
      if (!b) throw new Error(`no link counters for ${c.origin.name}`);
      return tcpPayloadBytes(now.txBytes - b.txBytes, now.txPackets - b.txPackets);
    };
    egress = await startEgressSampler(c, c.origin);
    const cpu = startCpuSampler(500, () => c.cpuSeconds());
    const cpuByProgram = startProgramCpuSampler(() => withDescendants(c.pids()));
    let cpuAfterReady: ReturnType<typeof startCpuSampler> | undefined;
    let cpuToReady: CpuReport | undefined;
    let cpuByProgramToReady: Record<string, number> = {};
    let registryAtLastReady: Promise<number> | undefined;
    let readyCount = 0;
    // Every node's pull waits at the start gate until all of them are spawned, then all go at once.
    const armed = await armGated(
      c,
      nodes.map((node) => ({ node: node.host, script: 'exec "$0" "$@"', args: node.pullCommand(ref) })),
    );
    const t0 = nowSeconds();
    const pulls = armed.release();
    log(`${spec.label}: pull requested on ${nodes.length} nodes`);

    const results = await Promise.all(
      nodes.map(async (node, i) => {
        const pull = await itemAt(pulls, i);
        if (pull.code !== 0)
          throw new Error(`[${node.host.name}] pull of ${ref} failed (exit ${pull.code}): ${pull.stderr.trim() || pull.stdout.trim()}`);
        const pulledSeconds = pull.endedAt - t0;
        let readySeconds: number | undefined;
        let readyLine = '';
        let atReady: Promise<[number, number]> | undefined;
        await node.run(ref, `e2e-${process.pid}-${row}-${runCounter}-${node.host.name}`, (line) => {
          if (readySeconds !== undefined || !line.startsWith('ready')) return;
          readySeconds = nowSeconds() - t0;
          readyLine = line.trim();
          if (++readyCount === nodes.length) {
            cpuToReady = cpu.stop();
            cpuByProgramToReady = cpuByProgram.stop();
            cpuAfterReady = startCpuSampler(500, () => c.cpuSeconds());
            registryAtLastReady = registrySent();
          }
          atReady = Promise.all([c.counters(node.host).then((now) => received(now, node.host.name)), node.diskBytes(nodeDirs(node))]);
        });
        if (readySeconds === undefined || !atReady)
          throw new Error(`[${node.host.name}] the workload exited without printing its ready line`);
        if (readyLine !== ctx.image.readyLine)
          throw new Error(`[${node.host.name}] the workload printed "${readyLine}", not "${ctx.image.readyLine}": it read other bytes`);
        const [readBytes, diskBytes] = await atReady;
        log(`  ${node.host.name}: ready at ${readySeconds.toFixed(2)} s (pulled at ${pulledSeconds.toFixed(2)} s)`);
        return { node: node.host.name, pulledSeconds, readySeconds, readBytes, diskBytes };
      }),
    );
    // Set by the last node's ready line; every node printed one, or the pulls above threw.
    if (!registryAtLastReady || !cpuToReady)
      throw new Error(`${readyCount} of ${nodes.length} nodes printed their ready line: no registry bytes or CPU at ready to report`);
    const registryBytes = await registryAtLastReady;

    // Lazy rows: the rest of each layer arrives in the background; note when each node holds it all.
    const whole = spec.lazy?.backgroundFetch
      ? await untilWholeImage(nodes, layers.length, t0, ctx.wholeImageTimeoutMs ?? 3_600_000)
      : new Map<string, number>();
    const backgroundCpu = cpuAfterReady?.stop();
    const egressRecord = await egress.stop();
    egress = undefined;
    const after = await c.allCounters();
    const nodeResults: NodeResult[] = await Promise.all(
      results.map(async (r, i) => {
        const node = itemAt(nodes, i);
        return {
          ...r,
          wholeImageSeconds: spec.lazy ? whole.get(r.node) : r.pulledSeconds,
          finalReadBytes: received(after.get(r.node), r.node),
          finalDiskBytes: await node.diskBytes(nodeDirs(node)),
        };
      }),
    );
    const summary = summarize(nodeResults.map((n) => ({ node: n.node, done: n.readySeconds })));
    const neededBytes = spec.image === 'plain' ? ctx.image.plain.bytes : ctx.image.lazy.neededBytes;
    const wholeTimes = nodeResults.map((n) => n.wholeImageSeconds).filter((t): t is number => t !== undefined);
    const nodeLink = itemAt(c.nodes, 0).rate.down;
    if (nodeLink === undefined) throw new Error("the nodes' links must be capped");
    return {
      row,
      label: spec.label,
      image: spec.image,
      neededBytes,
      imageBytes: spec.image === 'plain' ? ctx.image.plain.bytes : ctx.image.lazy.bytes,
      nodeLinkBitsPerSecond: nodeLink,
      firstSeconds: summary.first,
      medianSeconds: summary.median,
      lastSeconds: summary.last,
      startSpreadSeconds: startSpread(await Promise.all(pulls)),
      registryBytes,
      registryCopies: registryBytes / neededBytes,
      registryBytesTotal: egressRecord.bytes,
      registryPeakBitsPerSecond: egressRecord.peakBitsPerSecond,
      readBytesPerNode: nodeResults.map((n) => n.readBytes),
      diskBytesPerNode: nodeResults.map((n) => n.diskBytes),
      lastWholeImageSeconds: wholeTimes.length === nodeResults.length ? Math.max(...wholeTimes) : undefined,
      nodes: nodeResults,
      egressSamples: egressRecord.samples,
      cpu: cpuToReady,
      cpuSecondsByProgram: cpuByProgramToReady,
      cpuAfterReady: spec.lazy?.backgroundFetch ? backgroundCpu : undefined,
    };
  } finally {
    await egress?.stop().catch(() => {});
    for (const node of nodes) await node.stop().catch((error: Error) => log(`stopping ${node.host.name}: ${error.message}`));
    await swarm?.stop();
  }
}

/** A fresh stack on every node; if one fails to start, the others are stopped and the error thrown. */
async function startNodes(ctx: E2eContext, spec: RowSpec, rowDir: string, registryHost: string): Promise<NodeStack[]> {
  const started = await Promise.allSettled(
    ctx.cluster.nodes.map((host) =>
      startNodeStack({
        cluster: ctx.cluster,
        host,
        dir: path.join(rowDir, host.name),
        registryHost,
        mirror: spec.swarm ? `http://${MIRROR}` : undefined,
        lazy: spec.lazy && {
          blobSource: spec.lazy.from === 'peer' ? `http://${MIRROR}` : `http://${registryHost}`,
          backgroundFetch: spec.lazy.backgroundFetch,
          config: ctx.snapshotterConfig,
        },
      }),
    ),
  );
  const nodes = started.flatMap((s) => (s.status === 'fulfilled' ? [s.value] : []));
  const failed = started.find((s): s is PromiseRejectedResult => s.status === 'rejected');
  if (failed) {
    for (const node of nodes) await node.stop().catch(() => {});
    throw failed.reason;
  }
  return nodes;
}

/** Seconds from t0 at which each node held every layer whole (its snapshotter's chunks_missing at 0). */
async function untilWholeImage(nodes: NodeStack[], layerCount: number, t0: number, timeoutMs: number): Promise<Map<string, number>> {
  const whole = new Map<string, number>();
  const deadline = Date.now() + timeoutMs;
  const pending = new Set(nodes);
  for (;;) {
    for (const node of [...pending]) {
      const progress = await node.lazyLayers();
      if (progress.mounted >= layerCount && progress.chunksMissing === 0) {
        whole.set(node.host.name, nowSeconds() - t0);
        pending.delete(node);
      }
    }
    if (pending.size === 0) return whole;
    if (Date.now() > deadline)
      throw new Error(
        `${[...pending].map((n) => n.host.name).join(', ')} did not hold the whole image ${timeoutMs / 1000} s after the last start`,
      );
    await sleep(250);
  }
}
