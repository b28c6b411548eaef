import type { Command } from 'commander';
import { loadConfig } from '../../common/config.js';
import { createLogger } from '../../common/log.js';
import { snapshotterConfigSchema, startSnapshotter } from '../../snapshotter/index.js';
import { waitForShutdown } from '../shared.js';

/** `starling snapshotter`: containerd's remote snapshotter (`[proxy_plugins.starling] type = "snapshot"`). */
export function registerSnapshotterCommand(program: Command): void {
  program
    .command('snapshotter')
    .description('run the containerd snapshotter: eStargz layers mounted lazily through FUSE, fetched through the local peer')
    .option('--socket <path>', 'gRPC unix socket for containerd\'s proxy plugin')
    .option('--root <dir>', 'snapshot metadata, overlay dirs, mountpoints and chunk caches')
    .option('--peer <url>', 'the local peer\'s mirror (default http://127.0.0.1:65001)')
    .option('--metrics-listen <host:port>', 'serve Prometheus metrics here')
    .option('--no-prefetch', 'do not prefetch prioritized files before a layer is ready')
    .option('--no-background-fetch', 'fetch only what is read')
    .option('--log-level <level>', 'trace, debug, info, warn, error')
    .option('--config <file>', 'YAML configuration file; flags override it')
    .action(async (options) => {
      const config = loadConfig(snapshotterConfigSchema, {
        file: options.config,
        flags: {
          socket: options.socket,
          root: options.root,
          peer: options.peer,
          // commander sets these to true unless --no-… was given: only a "no" overrides the file.
          prefetch: options.prefetch === false ? { enabled: false } : undefined,
          backgroundFetch: options.backgroundFetch === false ? { enabled: false } : undefined,
          metrics: { listen: options.metricsListen },
          log: { level: options.logLevel },
        },
      });
      const log = createLogger({ level: config.log.level, name: 'snapshotter' });
      const running = await startSnapshotter(config, log);
      await waitForShutdown(log, () => running.close());
    });
}
