import path from 'node:path';
import type { Command } from 'commander';
import { UserError } from '../../common/errors.js';
import { loadConfig } from '../../common/config.js';
import { createLogger } from '../../common/log.js';
import { requireFuseAddon } from '../../fuse/index.js';
import { waitForShutdown } from '../shared.js';

/** The flags of `starling snapshotter` as commander parses them (`--no-X` flags default to true). */
interface SnapshotterFlags {
  socket?: string;
  root?: string;
  peer?: string;
  metricsListen?: string;
  prefetch: boolean;
  backgroundFetch: boolean;
  fuseServer: boolean;
  logLevel?: string;
  config?: string;
}

/** `starling snapshotter`: containerd's remote snapshotter (`[proxy_plugins.starling] type = "snapshot"`). */
export function registerSnapshotterCommand(program: Command): void {
  program
    .command('snapshotter')
    .description('run the containerd snapshotter: eStargz layers mounted lazily through FUSE, fetched through the local peer')
    .option('--socket <path>', "gRPC unix socket for containerd's proxy plugin")
    .option('--root <dir>', 'snapshot metadata, overlay dirs, mountpoints and chunk caches')
    .option('--peer <url>', "the local peer's mirror (default http://127.0.0.1:65001)")
    .option('--metrics-listen <host:port>', 'serve Prometheus metrics here')
    .option('--no-prefetch', 'do not prefetch prioritized files before a layer is ready')
    .option('--no-background-fetch', 'fetch only what is read')
    .option('--no-fuse-server', 'serve the FUSE mounts in this process (they end with it) instead of a separate `starling fuse-server`')
    .option('--log-level <level>', 'trace, debug, info, warn, error')
    .option('--config <file>', 'YAML configuration file; flags override it')
    .action(async (options: SnapshotterFlags) => {
      requireFuseAddon();
      const { snapshotterConfigSchema, startSnapshotter } = await import('../../snapshotter/index.js');
      const config = loadConfig(snapshotterConfigSchema, {
        file: options.config,
        flags: {
          socket: options.socket,
          root: options.root,
          peer: options.peer,
          // commander sets these to true unless --no-… was given: only a "no" overrides the file.
          prefetch: options.prefetch === false ? { enabled: false } : undefined,
          backgroundFetch: options.backgroundFetch === false ? { enabled: false } : undefined,
          fuseServer: options.fuseServer === false ? { enabled: false } : undefined,
          metrics: { listen: options.metricsListen },
          log: { level: options.logLevel },
        },
      });
      const log = createLogger({ level: config.log.level, name: 'snapshotter' });
      const running = await startSnapshotter(config, log);
      await waitForShutdown(log, () => running.close());
    });
}

/** `starling fuse-server`: started by the snapshotter; serves its lazy mounts and outlives its restarts. */
export function registerFuseServerCommand(program: Command): void {
  program
    .command('fuse-server')
    .description("serve a snapshotter's lazy FUSE mounts (the snapshotter starts it; it outlives snapshotter restarts)")
    .requiredOption('--root <dir>', "the snapshotter's root: the socket, pid file and log live there")
    .option('--idle-exit <seconds>', 'exit after serving nothing, with no snapshotter connected, this long', '60')
    .option('--log-level <level>', 'trace, debug, info, warn, error', 'info')
    .action(async (options: { root: string; idleExit: string; logLevel: string }) => {
      requireFuseAddon();
      const idleExitSeconds = Number(options.idleExit);
      if (!Number.isInteger(idleExitSeconds) || idleExitSeconds < 1)
        throw new UserError(`--idle-exit: expected whole seconds ≥ 1, got "${options.idleExit}"`);
      const log = createLogger({ level: options.logLevel, name: 'fuse-server', pretty: false });
      const { startFuseServer } = await import('../../snapshotter/index.js');
      const running = await startFuseServer({ root: path.resolve(options.root), idleExitMs: idleExitSeconds * 1000, log });
      await Promise.race([running.stopped, waitForShutdown(log, () => running.close())]);
      process.exit(0);
    });
}
