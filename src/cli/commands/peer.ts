import type { Command } from 'commander';
import { loadConfig } from '../../common/config.js';
import { createLogger } from '../../common/log.js';
import { tlsFlags, type TlsFlags } from '../../common/tls.js';
import { peerConfigSchema } from '../../peer/config.js';
import { parseLabelFlags } from '../../peer/labels.js';
import { collect, waitForShutdown } from '../shared.js';

/** The flags of `starling peer` as commander parses them. */
interface PeerFlags extends TlsFlags {
  dataDir?: string;
  mirrorListen?: string;
  insecureRegistry: string[];
  registryDefault?: string;
  quota?: string;
  downloadRateLimit?: string;
  scheduler?: string;
  manager?: string;
  uploadListen?: string;
  advertiseIp?: string;
  hostId?: string;
  seed?: boolean;
  label: string[];
  labelsFile?: string;
  clusterTokenFile?: string;
  uploadRateLimit?: string;
  uploadSlots?: number;
  pieceParallelism?: number;
  logLevel?: string;
  config?: string;
}

export function registerPeerCommand(program: Command): void {
  program
    .command('peer')
    .description('run the peer daemon: a caching OCI registry mirror for containerd, podman and skopeo')
    .option('--data-dir <dir>', 'where pieces and metadata are stored')
    .option('--mirror-listen <host:port>', 'mirror address (default 127.0.0.1:65001)')
    .option('--insecure-registry <host:port>', 'a registry reached over plain HTTP (repeatable)', collect, [])
    .option('--registry-default <url>', 'upstream used when a request names no registry (skopeo, podman)')
    .option('--quota <size>', 'disk quota for blob data, e.g. 20GiB')
    .option('--download-rate-limit <rate>', 'download rate limit from the origin, e.g. 100MB or 800Mbit (0 = none)')
    .option('--scheduler <host:port,...>', 'schedulers to join (comma-separated); without one the peer works alone')
    .option('--manager <url>', 'the manager: it names the schedulers and sends preheat jobs')
    .option('--upload-listen <host:port>', 'where other peers fetch pieces (default 127.0.0.1:65002)')
    .option('--advertise-ip <ip>', 'the address other peers use to reach the upload server')
    .option('--host-id <id>', "this host's id in the swarm (default: hostname-ip-port)")
    .option('--seed', 'act as a seed peer: fetch from the origin when the scheduler asks')
    .option('--label <key=value>', 'a host label such as zone=a or rack=r1 (repeatable)', collect, [])
    .option('--labels-file <file>', 'Kubernetes node labels (YAML/JSON map or a node object)')
    .option('--cluster-token-file <file>', 'token shared by peers and schedulers')
    .option('--upload-rate-limit <rate>', 'upload rate limit to other peers, e.g. 100MB or 800Mbit (0 = none)')
    .option('--upload-slots <n>', 'pieces uploaded at once', (v) => Number(v))
    .option('--piece-parallelism <n>', 'pieces fetched from parents at once per blob', (v) => Number(v))
    .option('--tls-cert <file>', 'PEM certificate the upload server presents (with --tls-key and --tls-ca: TLS between components)')
    .option('--tls-key <file>', 'PEM key of --tls-cert')
    .option('--tls-ca <file>', 'PEM certificate of the cluster CA: schedulers, peers and the manager must present certificates it signed')
    .option('--log-level <level>', 'trace, debug, info, warn, error')
    .option('--config <file>', 'YAML configuration file; flags override it')
    .action(async (options: PeerFlags) => {
      const config = loadConfig(peerConfigSchema, {
        file: options.config,
        flags: {
          dataDir: options.dataDir,
          mirror: { listen: options.mirrorListen },
          registries: {
            insecure: options.insecureRegistry.length ? options.insecureRegistry : undefined,
            default: options.registryDefault,
          },
          storage: { quota: options.quota },
          download: { rateLimit: options.downloadRateLimit },
          swarm: {
            schedulers: options.scheduler
              ? options.scheduler
                  .split(',')
                  .map((s) => s.trim())
                  .filter(Boolean)
              : undefined,
            manager: options.manager,
            uploadListen: options.uploadListen,
            advertiseIp: options.advertiseIp,
            hostId: options.hostId,
            seed: options.seed,
            labels: options.label.length ? parseLabelFlags(options.label) : undefined,
            labelsFile: options.labelsFile,
            clusterTokenFile: options.clusterTokenFile,
            uploadRateLimit: options.uploadRateLimit,
            uploadSlots: options.uploadSlots,
            pieceParallelism: options.pieceParallelism,
          },
          tls: tlsFlags(options),
          log: { level: options.logLevel },
        },
      });
      const log = createLogger({ level: config.log.level, name: 'peer' });
      const { startPeer } = await import('../../peer/daemon.js');
      const peer = await startPeer(config, log);
      await waitForShutdown(log, () => peer.close());
    });
}
