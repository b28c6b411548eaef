// A Starling swarm on an emulated cluster (bench/lib/cluster.ts): the scheduler on the cluster's
// `sched` extra host, a seed peer on its seed host, and a peer on every node, each mirror on
// 127.0.0.1:65001 of its own namespace. Shared by the swarm benchmarks.
import { randomBytes } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { waitFor, type Service } from '../../test/fixtures/processes.js';
import { seedOf, type Cluster, type ClusterHost } from './cluster.js';

const CLI = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../dist/cli/main.js');
/** Every peer's mirror, inside its own namespace. */
export const MIRROR = '127.0.0.1:65001';

export interface SwarmOptions {
  /** host:port of the registry, reached over plain HTTP. */
  registryHost: string;
  /** Folder for data dirs and logs. */
  workDir: string;
  /** Candidate parents per peer (the scheduler's --candidate-parent-limit). */
  parentLimit?: string;
  /** Extra scheduler flags, e.g. ['--shape', 'pipeline']. */
  schedulerArgs?: string[];
  peerArgs?: string[];
  seedArgs?: string[];
  /** A tag for this swarm's data dirs and logs, so several swarms can share a work folder. */
  tag?: string;
}

export interface Swarm {
  schedulerHost: ClusterHost;
  /** The scheduler's metrics and API address (host:port). */
  schedulerApi: string;
  services: Service[];
  /** A peer's data directory (its piece store). */
  dataDir(host: ClusterHost): string;
  /** Every process's log file. */
  logFiles(): string[];
  /** The scheduler's view of a task (GET /api/tasks/<digest>). */
  task(digest: string): Promise<SchedulerTask>;
  stop(): Promise<void>;
}

export interface SchedulerTask {
  bytesFromPeers?: number;
  bytesFromSeeds?: number;
  bytesFromOrigin?: number;
  peers?: Array<{ hostId: string; bytesByParentHost: Record<string, number> }>;
}

/** `STARLING_CPU_PROF_DIR=DIR`: every peer writes a V8 CPU profile there when it stops. */
function cpuProfileEnv(): Record<string, string> | undefined {
  return process.env.STARLING_CPU_PROF_DIR
    ? {
        NODE_OPTIONS: `--import ${fileURLToPath(new URL('./cpu-prof-preload.mjs', import.meta.url))}`,
        STARLING_CPU_PROF_DIR: path.resolve(process.env.STARLING_CPU_PROF_DIR),
      }
    : undefined;
}

async function answers(c: Cluster, host: ClusterHost, url: string): Promise<boolean> {
  return (
    (await c.exec(host, 'curl', ['-s', '-o', '/dev/null', '-w', '%{http_code}', '--noproxy', '*', url], { allowFail: true })).stdout ===
    '200'
  );
}

/** Starts the scheduler, the seed and every node's peer, and waits until all of them answer. */
export async function startSwarm(c: Cluster, options: SwarmOptions): Promise<Swarm> {
  const sched = c.extras.sched;
  if (!sched) throw new Error('the cluster needs an extra host named "sched" for the scheduler');
  if (!c.seed) throw new Error('the cluster needs a seed host');
  const tag = options.tag ? `${options.tag}-` : '';
  const log = (name: string) => path.join(options.workDir, `${tag}${name}.log`);
  const dataDir = (host: ClusterHost) => path.join(options.workDir, `${tag}data-${host.name}`);
  const services: Service[] = [];
  const scheduler = `${sched.ip}:8002`;
  const schedulerApi = `${sched.ip}:8003`;
  const stop = async () => {
    for (const service of services.reverse()) await service.stop().catch(() => {});
  };
  // The token every member of the cluster shares (schedulers and swarm peers refuse to run without one).
  const tokenFile = path.join(options.workDir, `${tag}cluster.token`);
  const clusterToken = randomBytes(24).toString('hex');
  await writeFile(tokenFile, clusterToken);
  const token = ['--cluster-token-file', tokenFile];
  try {
    services.push(
      await c.spawn(
        sched,
        process.execPath,
        [
          CLI,
          'scheduler',
          '--listen',
          scheduler,
          '--metrics-listen',
          schedulerApi,
          ...token,
          '--candidate-parent-limit',
          options.parentLimit ?? '5',
          ...(options.schedulerArgs ?? []),
        ],
        {
          name: 'scheduler',
          logFile: log('scheduler'),
        },
      ),
    );
    await waitFor(() => answers(c, sched, `http://${schedulerApi}/healthz`), 30_000, 'scheduler');
    const startPeer = (host: ClusterHost, seed: boolean) =>
      c.spawn(
        host,
        process.execPath,
        [
          CLI,
          'peer',
          '--data-dir',
          dataDir(host),
          '--mirror-listen',
          MIRROR,
          '--insecure-registry',
          options.registryHost,
          '--scheduler',
          scheduler,
          '--upload-listen',
          `${host.ip}:65002`,
          '--host-id',
          host.name,
          '--log-level',
          'warn',
          ...token,
          ...(seed ? ['--seed'] : []),
          ...((seed ? options.seedArgs : options.peerArgs) ?? []),
        ],
        { name: host.name, logFile: log(host.name), env: cpuProfileEnv() },
      );
    services.push(await startPeer(c.seed, true));
    services.push(...(await Promise.all(c.nodes.map((node) => startPeer(node, false)))));
    // Every mirror answers before the clock starts.
    await Promise.all(
      [c.seed, ...c.nodes].map((host) => waitFor(() => answers(c, host, `http://${MIRROR}/healthz`), 30_000, `${host.name} peer`)),
    );
  } catch (error) {
    await stop();
    throw error;
  }
  return {
    schedulerHost: sched,
    schedulerApi,
    services,
    dataDir,
    logFiles: () => services.map((s) => s.logFile),
    async task(digest) {
      const res = await c.exec(
        sched,
        'curl',
        ['-s', '--noproxy', '*', '-H', `authorization: Bearer ${clusterToken}`, `http://${schedulerApi}/api/tasks/${digest}`],
        { allowFail: true },
      );
      return JSON.parse(res.stdout || '{}') as SchedulerTask;
    },
    stop,
  };
}

/** Sums a counter over every peer's /metrics, by its labels (e.g. upload requests by kind and outcome). */
export async function sumPeerMetric(c: Cluster, pattern: RegExp): Promise<Record<string, number>> {
  const sums: Record<string, number> = {};
  await Promise.all(
    [seedOf(c), ...c.nodes].map(async (host) => {
      const text = (await c.exec(host, 'curl', ['-s', '--noproxy', '*', `http://${MIRROR}/metrics`], { allowFail: true })).stdout;
      for (const m of text.matchAll(pattern)) {
        const key = m.slice(1, -1).join(' ');
        sums[key] = (sums[key] ?? 0) + Number(m[m.length - 1]);
      }
    }),
  );
  return sums;
}
