// Plumbing for the snapshotter tests: `starling snapshotter` as its own process (so it can be
// killed with -9), a gRPC client for its socket, and a containerd that loads it as a proxy plugin.
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { SnapshotsService } from '../../src/snapshotter/index.js';
import { request } from 'undici';
import { STARLING_CLI, sumMetric } from '../fixtures/peer.js';
import { freePort, mountsUnder, onExitCleanup, runOk, spawnService, unmountUnderSync, waitFor, type Service } from '../fixtures/processes.js';

export interface SnapshotterProcess {
  socket: string;
  root: string;
  metricsUrl: string;
  service: Service;
  /** Starts it again on the same socket, root and metrics port (after stop or kill9). */
  restart(): Promise<SnapshotterProcess>;
  /** Stops the snapshotter and its FUSE server (which would otherwise keep serving the mounts). */
  stop(): Promise<void>;
  /** The pid of the FUSE server serving this root, if one runs. */
  fuseServerPid(): number | undefined;
  /** Sum of a metric's samples, optionally only those with `digest`. */
  metric(name: string, digest?: string): Promise<number>;
  /** The whole /metrics page. */
  metricsText(): Promise<string>;
}

export interface SnapshotterOptions {
  dir: string;
  peerUrl: string;
  /** YAML written to <dir>/snapshotter.yaml and passed with --config. */
  configYaml?: string;
  port?: number;
  /** Default debug. */
  logLevel?: string;
  /**
   * An argv prefix that runs it in another network namespace (`nsenter --net=… --`), where
   * `peerUrl` and the metrics port are reached (metrics are then read with curl run there).
   */
  netns?: string[];
}

export async function startSnapshotterProcess(opts: SnapshotterOptions): Promise<SnapshotterProcess> {
  const socket = path.join(opts.dir, 'snapshotter.sock');
  const root = path.join(opts.dir, 'root');
  // The FUSE server runs detached from the snapshotter: make sure even a crashed test ends it.
  onExitCleanup(() => {
    const pid = fuseServerPid(root);
    if (pid) process.kill(pid, 'SIGKILL');
    unmountUnderSync(root);
  });
  const port = opts.port ?? (await freePort());
  const netns = opts.netns ?? [];
  const args = [STARLING_CLI, 'snapshotter', '--socket', socket, '--root', root, '--peer', opts.peerUrl, '--metrics-listen', `127.0.0.1:${port}`, '--log-level', opts.logLevel ?? 'debug'];
  if (opts.configYaml) {
    const file = path.join(opts.dir, 'snapshotter.yaml');
    await fsp.writeFile(file, opts.configYaml);
    args.push('--config', file);
  }
  const logFile = path.join(opts.dir, 'snapshotter.log');
  const logStart = fs.existsSync(logFile) ? fs.statSync(logFile).size : 0; // a restart appends to the same log
  const [cmd, ...prefix] = [...netns, process.execPath];
  const service = await spawnService({ cmd, args: [...prefix, ...args], name: 'starling-snapshotter', logFile });
  await waitFor(
    () => {
      if (!service.running) throw Object.assign(new Error(`snapshotter exited: ${service.logTail()}`), { fatal: true });
      return service.readLog().slice(logStart).includes('snapshotter ready');
    },
    30_000,
    'snapshotter ready',
    50,
    (error) => Boolean((error as { fatal?: boolean }).fatal),
  );
  const metricsUrl = `http://127.0.0.1:${port}/metrics`;
  const metricsText = async () => {
    if (!netns.length) return (await request(metricsUrl)).body.text();
    const [curl, ...curlArgs] = [...netns, 'curl', '-sS', '--fail', '--noproxy', '*', metricsUrl];
    return (await runOk(curl, curlArgs)).stdout;
  };
  return {
    socket,
    root,
    metricsUrl,
    service,
    restart: () => startSnapshotterProcess({ ...opts, port }),
    stop: async () => {
      await service.stop();
      await stopFuseServer(root);
    },
    fuseServerPid: () => fuseServerPid(root),
    metricsText,
    metric: async (name, digest) => sumMetric(await metricsText(), name, digest ? { digest } : {}),
  };
}

/** The live FUSE server of a snapshotter root (from its pid file). */
export function fuseServerPid(root: string): number | undefined {
  let text: string;
  try {
    text = fs.readFileSync(path.join(root, 'fuse-server.pid'), 'utf8');
  } catch {
    return undefined; // none was started, or it stopped
  }
  const pid = Number(text.trim());
  if (!Number.isInteger(pid) || pid <= 0) return undefined;
  try {
    process.kill(pid, 0);
    return pid;
  } catch {
    return undefined;
  }
}

/** SIGTERM to the root's FUSE server (it unmounts what it serves), SIGKILL after 10 s. */
export async function stopFuseServer(root: string): Promise<void> {
  const pid = fuseServerPid(root);
  if (!pid) return;
  process.kill(pid, 'SIGTERM');
  const gone = () => {
    try {
      process.kill(pid, 0);
      return false;
    } catch {
      return true;
    }
  };
  await waitFor(gone, 10_000, 'FUSE server exit').catch(() => {
    if (!gone()) process.kill(pid, 'SIGKILL');
  });
}

/** The `[proxy_plugins.starling]` table for containerd's config. */
export function proxyPluginConfig(socket: string): string {
  return ['[proxy_plugins.starling]', '  type = "snapshot"', `  address = ${JSON.stringify(socket)}`].join('\n');
}

export type SnapshotsClient = grpc.Client & Record<string, (...args: any[]) => any>;

export function snapshotsClient(socket: string): SnapshotsClient {
  const Service = SnapshotsService();
  return new Service(`unix:${socket}`, grpc.credentials.createInsecure()) as unknown as SnapshotsClient;
}

/** A unary call as a promise; rejects with the grpc error (its `code` is the status). */
export function call<T = any>(client: SnapshotsClient, method: string, req: object): Promise<T> {
  return new Promise((resolve, reject) => client[method]!(req, (error: grpc.ServiceError | null, res: T) => (error ? reject(error) : resolve(res))));
}

export function list(client: SnapshotsClient, filters: string[] = []): Promise<any[]> {
  return new Promise((resolve, reject) => {
    const infos: any[] = [];
    const stream = client.List!({ filters });
    stream.on('data', (m: { info: any[] }) => infos.push(...m.info));
    stream.on('error', reject);
    stream.on('end', () => resolve(infos));
  });
}

/** FUSE mounts below `dir` and whether each answers (statfs in a child: never block on a dead mount here). */
export function fuseMountsUnder(dir: string): string[] {
  const lines = fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n');
  return mountsUnder(dir).filter((p) => lines.some((l) => l.split(' ')[4] === p && / - fuse/.test(l)));
}
