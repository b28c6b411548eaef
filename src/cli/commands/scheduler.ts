import type { Command } from 'commander';
import { loadConfig } from '../../common/config.js';
import { createLogger } from '../../common/log.js';
import { tlsFlags, type TlsFlags } from '../../common/tls.js';
import { schedulerConfigSchema } from '../../scheduler/config.js';
import { waitForShutdown } from '../shared.js';

/** The flags of `starling scheduler` as commander parses them. */
interface SchedulerFlags extends TlsFlags {
  listen?: string;
  metricsListen?: string;
  manager?: string;
  clusterName?: string;
  clusterTokenFile?: string;
  shape?: string;
  fanout?: number;
  seedFanout?: number;
  candidateParentLimit?: number;
  backToSourceLimit?: number;
  logLevel?: string;
  config?: string;
}

export function registerSchedulerCommand(program: Command): void {
  program
    .command('scheduler')
    .description('run the scheduler: picks parents for peers, decides who reads the origin, triggers seeds')
    .option('--listen <host:port>', 'gRPC address (default 127.0.0.1:8002)')
    .option('--metrics-listen <host:port>', 'Prometheus /metrics address (default 127.0.0.1:8003)')
    .option('--manager <url>', "the manager: register there and take the scheduler cluster's settings from it")
    .option('--cluster-name <name>', 'the scheduler cluster to join in the manager')
    .option('--cluster-token-file <file>', 'token peers must present (required); also sent to seeds and the manager')
    .option(
      '--shape <shape>',
      'parent graph: adaptive (the default: chains placed by measured link rates), mesh (several parents per peer) or pipeline (fixed chains); see the README',
    )
    .option(
      '--fanout <n>',
      'pipeline, adaptive: chain children each node feeds (the adaptive shape adds more where it measures room)',
      (v) => Number(v),
    )
    .option('--seed-fanout <n>', 'pipeline, adaptive: chain children each seed feeds (likewise)', (v) => Number(v))
    .option('--candidate-parent-limit <n>', 'mesh: parents handed to each peer', (v) => Number(v))
    .option('--back-to-source-limit <n>', 'peers per task that may read the origin at once', (v) => Number(v))
    .option('--tls-cert <file>', 'PEM certificate the gRPC port presents (with --tls-key and --tls-ca: TLS between components)')
    .option('--tls-key <file>', 'PEM key of --tls-cert')
    .option('--tls-ca <file>', 'PEM certificate of the cluster CA: seeds and the manager must present certificates it signed')
    .option('--log-level <level>', 'trace, debug, info, warn, error')
    .option('--config <file>', 'YAML configuration file; flags override it')
    .action(async (options: SchedulerFlags) => {
      const config = loadConfig(schedulerConfigSchema, {
        file: options.config,
        flags: {
          listen: options.listen,
          metricsListen: options.metricsListen,
          clusterTokenFile: options.clusterTokenFile,
          manager: options.manager,
          clusterName: options.clusterName,
          scheduling: {
            shape: options.shape,
            pipeline: { fanout: options.fanout, seedFanout: options.seedFanout },
            candidateParentLimit: options.candidateParentLimit,
            backToSourceLimit: options.backToSourceLimit,
          },
          tls: tlsFlags(options),
          log: { level: options.logLevel },
        },
      });
      const log = createLogger({ level: config.log.level, name: 'scheduler' });
      const { startScheduler } = await import('../../scheduler/server.js');
      const scheduler = await startScheduler(config, log);
      await waitForShutdown(log, () => scheduler.close());
    });
}
