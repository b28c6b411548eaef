import { mkdir } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import type { Command } from 'commander';
import { loadConfig } from '../../common/config.js';
import { createLogger } from '../../common/log.js';
import { peerConfigSchema } from '../../peer/config.js';
import type { RunningPeer } from '../../peer/daemon.js';
import { managerConfigSchema } from '../../manager/config.js';
import { schedulerConfigSchema } from '../../scheduler/config.js';
import { collect, invokedAs, waitForShutdown } from '../shared.js';

/** The flags of `starling up` as commander parses them. */
interface UpFlags {
  dataDir: string;
  insecureRegistry: string[];
  registryDefault?: string;
  quota: string;
  logLevel: string;
}

/**
 * Everything on one machine with defaults: the manager (SQLite), a scheduler, a seed peer and
 * the peer mirror that containerd pulls through, all keeping their state under one data directory.
 */
export function registerUpCommand(program: Command): void {
  program
    .command('up')
    .description('run Starling on this machine: manager, scheduler, seed peer and the peer mirror on 127.0.0.1:65001')
    .option('--data-dir <dir>', 'where everything is stored', '.starling')
    .option('--insecure-registry <host:port>', 'a registry reached over plain HTTP (repeatable)', collect, [])
    .option('--registry-default <url>', 'upstream for clients that name no registry (skopeo, podman)')
    .option('--quota <size>', 'disk quota of the peer mirror', '20GiB')
    .option('--log-level <level>', 'trace, debug, info, warn, error', 'info')
    .action(async (options: UpFlags) => {
      const dataDir = resolve(options.dataDir);
      const log = createLogger({ level: options.logLevel, name: 'starling' });
      const [{ startManager }, { startScheduler }, { startPeer }, { ensureClusterToken, ensureTlsFiles }] = await Promise.all([
        import('../../manager/server.js'),
        import('../../scheduler/server.js'),
        import('../../peer/daemon.js'),
        import('../../common/tls-files.js'),
      ]);
      // Made at the first start and kept: every internal endpoint requires the token, and TLS
      // carries it (and any registry credentials) between the components.
      await mkdir(dataDir, { recursive: true });
      const clusterTokenFile = await ensureClusterToken(join(dataDir, 'cluster-token'));
      const tls = await ensureTlsFiles(join(dataDir, 'tls'), { dns: ['localhost'], ips: ['127.0.0.1', '::1'] });
      const manager = await startManager(
        loadConfig(managerConfigSchema, {
          flags: {
            listen: '127.0.0.1:8080',
            dataDir: join(dataDir, 'manager'),
            registries: { insecure: options.insecureRegistry },
            clusterTokenFile,
            tls,
          },
        }),
        log.child({ component: 'manager' }),
      );
      let scheduler;
      try {
        scheduler = await startScheduler(
          loadConfig(schedulerConfigSchema, {
            flags: { listen: '127.0.0.1:8002', metricsListen: '127.0.0.1:8003', manager: manager.url, clusterTokenFile, tls },
          }),
          log.child({ component: 'scheduler' }),
        );
      } catch (error) {
        await manager.close();
        throw error;
      }
      const registries = { insecure: options.insecureRegistry, default: options.registryDefault };
      const peers: RunningPeer[] = [];
      // The seed and the mirror differ only in role, ports and folder.
      const startLocalPeer = (role: 'seed' | 'peer', mirrorPort: number, uploadPort: number) =>
        startPeer(
          loadConfig(peerConfigSchema, {
            flags: {
              dataDir: join(dataDir, role),
              mirror: { listen: `127.0.0.1:${mirrorPort}` },
              registries,
              storage: { quota: options.quota },
              tls,
              swarm: {
                schedulers: [scheduler.address],
                manager: manager.url,
                uploadListen: `127.0.0.1:${uploadPort}`,
                seed: role === 'seed',
                hostId: `local-${role}`,
                clusterTokenFile,
              },
            },
          }),
          log.child({ component: role }),
        );
      let seedPeer: RunningPeer;
      let mirrorPeer: RunningPeer;
      try {
        peers.push((seedPeer = await startLocalPeer('seed', 65011, 65012)));
        peers.push((mirrorPeer = await startLocalPeer('peer', 65001, 65002)));
      } catch (error) {
        for (const peer of peers) await peer.close();
        await scheduler.close();
        await manager.close();
        throw error;
      }
      const mirror = mirrorPeer.mirrorAddress;
      process.stdout.write(
        [
          '',
          `Starling is up (data in ${dataDir}).`,
          `  peer mirror   http://${mirror}   (metrics: http://${mirror}/metrics)`,
          `  web console   ${manager.url}/   (log in with an admin or read-only token; TLS from the CA in ${tls.ca})`,
          `  manager       ${manager.url}   (API: ${manager.url}/api/v1, OpenAPI: ${manager.url}/api/v1/openapi.json)`,
          ...(manager.initialAdminToken ? [`  admin token   ${manager.initialAdminToken}   (shown once: keep it)`] : []),
          `  scheduler     ${scheduler.address}   (metrics: http://${scheduler.metricsAddress}/metrics)`,
          `  seed peer     http://${seedPeer.mirrorAddress}`,
          `  cluster token ${clusterTokenFile}   (internal endpoints require it; TLS files in ${join(dataDir, 'tls')})`,
          '',
          'Point containerd at the mirror:',
          `  ${invokedAs()} containerd-config --hosts-dir /etc/containerd/certs.d --mirror http://${mirror}`,
          '  then set config_path = "/etc/containerd/certs.d" under [plugins."io.containerd.grpc.v1.cri".registry],',
          `  or pass --hosts-dir /etc/containerd/certs.d to ctr.`,
          '',
        ].join('\n'),
      );
      await waitForShutdown(log, async () => {
        for (const peer of [...peers].reverse()) await peer.close();
        await scheduler.close();
        await manager.close();
      });
    });
}
