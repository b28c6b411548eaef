// One emulated node of the end-to-end runs: in the node's network namespace, its own containerd 1.6
// (own root, state and socket; runc under it) and, for the lazy rows, its own `starling snapshotter`
// (with its FUSE server) reading blobs from `blobSource` — the node's Starling peer, or the registry
// itself. Every directory of the node is under `dir`, so what the node wrote to disk is `du` of it
// (plus its peer's store, which the swarm keeps elsewhere).
import fsp from 'node:fs/promises';
import path from 'node:path';
import { startContainerd, writeHostsToml, type Containerd } from '../../test/fixtures/containerd.js';
import { sumMetric } from '../../test/fixtures/peer.js';
import { run } from '../../test/fixtures/processes.js';
import { proxyPluginConfig, startSnapshotterProcess, type SnapshotterProcess } from '../../test/fixtures/snapshotter.js';
import type { Cluster, ClusterHost } from './cluster.js';

/** The snapshotter's metrics, on its node's own loopback. */
const SNAPSHOTTER_METRICS_PORT = 65009;
const SNAPSHOTTER = 'starling';

export interface NodeStackOptions {
  cluster: Cluster;
  host: ClusterHost;
  /** An empty directory for the node's containerd and snapshotter. */
  dir: string;
  /** host:port of the registry the image comes from. */
  registryHost: string;
  /** Where ctr and ctr-remote get manifests and (plain pulls) blobs: the node's peer mirror URL, or undefined for the registry. */
  mirror?: string;
  /**
   * Lazy rows: the snapshotter, reading blobs from this base URL (the peer's mirror, or the
   * registry), with more of its YAML configuration in `config` (any key but backgroundFetch).
   */
  lazy?: { blobSource: string; backgroundFetch: boolean; config?: string };
}

export interface NodeStack {
  host: ClusterHost;
  containerd: Containerd;
  snapshotter?: SnapshotterProcess;
  /**
   * The argv, to run in the node's namespace, of `ctr images pull`, or of `ctr-remote images rpull
   * --snapshotter starling` on a lazy node (bench/lib/e2e-rows.ts starts every node's at one moment).
   */
  pullCommand(ref: string): string[];
  /** `ctr run --rm` of the image's own command; `onLine` sees its stdout as it comes. Throws unless it exits 0. */
  run(ref: string, id: string, onLine: (line: string) => void): Promise<void>;
  /** Bytes the node's directories (and `extraDirs`) hold on disk, mounts left out (`du -sx`). */
  diskBytes(extraDirs?: string[]): Promise<number>;
  /** Lazy nodes: remote layers mounted, and their distinct chunks not cached yet (0: the node holds those layers whole). */
  lazyLayers(): Promise<{ mounted: number; chunksMissing: number }>;
  stop(): Promise<void>;
}

export async function startNodeStack(o: NodeStackOptions): Promise<NodeStack> {
  const netns = o.cluster.nsArgv(o.host);
  const containerdDir = path.join(o.dir, 'containerd');
  await fsp.mkdir(containerdDir, { recursive: true });
  let snapshotter: SnapshotterProcess | undefined;
  if (o.lazy) {
    const snapshotterDir = path.join(o.dir, 'snapshotter');
    await fsp.mkdir(snapshotterDir, { recursive: true });
    snapshotter = await startSnapshotterProcess({
      dir: snapshotterDir,
      peerUrl: o.lazy.blobSource,
      port: SNAPSHOTTER_METRICS_PORT,
      logLevel: 'info',
      netns,
      configYaml: `backgroundFetch:\n  enabled: ${o.lazy.backgroundFetch}\n${o.lazy.config ?? ''}\n`,
    });
  }
  let containerd: Containerd;
  try {
    containerd = await startContainerd({
      dir: containerdDir,
      netns,
      extraConfig: snapshotter ? proxyPluginConfig(snapshotter.socket) : undefined,
    });
  } catch (error) {
    await snapshotter?.stop();
    throw error;
  }
  await writeHostsToml(containerd.hostsDir, o.registryHost, o.mirror);
  const long = { timeoutMs: 3_600_000 };
  const must = (what: string, res: { code: number | null; stderr: string; stdout: string }) => {
    if (res.code !== 0) throw new Error(`[${o.host.name}] ${what} failed (exit ${res.code}): ${res.stderr.trim() || res.stdout.trim()}`);
  };
  return {
    host: o.host,
    containerd,
    snapshotter,
    pullCommand(ref) {
      const client = ['--address', containerd.address, '--namespace', 'default'];
      const hosts = ['--plain-http', '--hosts-dir', containerd.hostsDir, ref];
      return snapshotter
        ? ['ctr-remote', ...client, 'images', 'rpull', '--snapshotter', SNAPSHOTTER, ...hosts]
        : ['ctr', ...client, 'images', 'pull', ...hosts];
    },
    async run(ref, id, onLine) {
      const args = ['run', '--rm', ...(snapshotter ? ['--snapshotter', SNAPSHOTTER] : []), ref, id];
      must(`ctr run ${ref}`, await containerd.ctr(args, { ...long, onStdoutLine: onLine }));
    },
    async diskBytes(extraDirs = []) {
      const res = await run('du', ['-sx', '--block-size=1', '--total', o.dir, ...extraDirs]);
      // containerd removes a finished task's state while du walks it: du then says so, exits 1 and
      // still prints its total, which counts what was there. Any other complaint fails the run.
      const vanished = res.stderr
        .trim()
        .split('\n')
        .every((line) => /^du: cannot (access|read directory) .*: No such file or directory$/.test(line));
      if (!(res.code === 1 && vanished)) must('du', res);
      const total = /(\d+)\s+total\s*$/.exec(res.stdout.trim());
      if (!total) throw new Error(`du printed no total: ${res.stdout}`);
      return Number(total[1]);
    },
    async lazyLayers() {
      if (!snapshotter) return { mounted: 0, chunksMissing: 0 };
      const text = await snapshotter.metricsText();
      return {
        mounted: sumMetric(text, 'starling_snapshotter_remote_layers'),
        chunksMissing: sumMetric(text, 'starling_snapshotter_layer_chunks_missing'),
      };
    },
    async stop() {
      await containerd.stop();
      await snapshotter?.stop();
    },
  };
}
