import type { Command } from 'commander';
import { loadConfig } from '../../common/config.js';
import { createLogger } from '../../common/log.js';
import { tlsFlags, type TlsFlags } from '../../common/tls.js';
import { managerConfigSchema } from '../../manager/config.js';
import { collect, waitForShutdown } from '../shared.js';

/** The flags of `starling manager` as commander parses them. */
interface ManagerFlags extends TlsFlags {
  listen?: string;
  db?: string;
  dataDir?: string;
  clusterTokenFile?: string;
  adminTokenFile?: string;
  jobLeaseMs?: number;
  insecureRegistry: string[];
  consoleDir?: string;
  logLevel?: string;
  config?: string;
}

export function registerManagerCommand(program: Command): void {
  program
    .command('manager')
    .description(
      'run the manager: scheduler clusters and settings, peer and scheduler registry, preheat jobs, users and tokens, web console',
    )
    .option('--listen <host:port>', 'HTTP address of the API and console (default 127.0.0.1:8080)')
    .option(
      '--db <url>',
      'sqlite:PATH or postgres://user:pass@host:port/db (default: $STARLING_MANAGER_DB, else sqlite:<data-dir>/manager.db); replicas share one PostgreSQL database',
    )
    .option('--data-dir <dir>', 'where the default SQLite database lives (default .starling/manager)')
    .option('--cluster-token-file <file>', 'token schedulers and peers present, and the manager presents to peers (required)')
    .option('--admin-token-file <file>', 'token of the initial admin user (first start only); without it one is printed once')
    .option(
      '--job-lease-ms <ms>',
      "how long a replica holds a preheat job without renewing it: a dead replica's jobs are taken over this long after (default 15000)",
      (v) => Number(v),
    )
    .option('--insecure-registry <host:port>', 'a registry reached over plain HTTP for preheats (repeatable)', collect, [])
    .option('--console-dir <dir>', 'built web console to serve at / (default: console/dist of the installation)')
    .option('--tls-cert <file>', 'PEM certificate the API presents (with --tls-key and --tls-ca: HTTPS, and TLS to the peers)')
    .option('--tls-key <file>', 'PEM key of --tls-cert')
    .option('--tls-ca <file>', 'PEM certificate of the cluster CA: peers must present certificates it signed')
    .option('--log-level <level>', 'trace, debug, info, warn, error')
    .option('--config <file>', 'YAML configuration file; flags override it')
    .action(async (options: ManagerFlags) => {
      const config = loadConfig(managerConfigSchema, {
        file: options.config,
        flags: {
          listen: options.listen,
          // The environment keeps a database password out of the command line (and `ps`).
          db: options.db ?? (process.env.STARLING_MANAGER_DB || undefined),
          dataDir: options.dataDir,
          clusterTokenFile: options.clusterTokenFile,
          adminTokenFile: options.adminTokenFile,
          preheat: { leaseMs: options.jobLeaseMs },
          registries: options.insecureRegistry.length ? { insecure: options.insecureRegistry } : undefined,
          consoleDir: options.consoleDir,
          tls: tlsFlags(options),
          log: { level: options.logLevel },
        },
      });
      const log = createLogger({ level: config.log.level, name: 'manager' });
      const { startManager } = await import('../../manager/server.js');
      const manager = await startManager(config, log);
      if (manager.initialAdminToken) {
        // Printed once: only its hash is stored.
        process.stdout.write(
          `\nInitial admin token (shown only now; store it safely):\n\n  ${manager.initialAdminToken}\n\n` +
            `Use it as "Authorization: Bearer <token>" with ${manager.url}/api/v1 or to log in to the console at ${manager.url}/\n\n`,
        );
      }
      await waitForShutdown(log, () => manager.close());
    });
}
