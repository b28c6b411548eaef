import type { Command } from 'commander';
import { UserError } from '../../common/errors.js';
import { NodeSetupError } from '../../node-setup/errors.js';
import { fetchNodeLabels, writeNodeLabels } from '../../node-setup/node-labels.js';
import { setUpNode, undoNodeSetup, type NodeSetupReport } from '../../node-setup/node-setup.js';
import { collect } from '../shared.js';

/** The flags of `starling node-setup` as commander parses them (`--no-restart` defaults to true). */
interface NodeSetupFlags {
  containerdConfig?: string;
  hostsDir?: string;
  mirror: string;
  registry: string[];
  insecureRegistry: string[];
  lazy?: boolean;
  snapshotterSocket: string;
  registriesConfDir?: string;
  configVersion?: string;
  backupDir?: string;
  restartCommand?: string;
  restart: boolean;
  undo?: boolean;
  force?: boolean;
}

/** The flags of `starling node-labels` as commander parses them. */
interface NodeLabelsFlags {
  node: string;
  out: string;
  rackLabel?: string;
  apiServer?: string;
  tokenFile?: string;
  caFile?: string;
}

/** `starling node-setup`: the peer DaemonSet's init container (what Dragonfly's dfinit does). */
export function registerNodeSetupCommand(program: Command): void {
  program
    .command('node-setup')
    .description("make this node's containerd (or CRI-O/podman) pull through the local Starling peer; --undo restores it")
    .option('--containerd-config <path>', "containerd's config.toml (k3s/RKE2: the rendered one; their template is edited)")
    .option('--hosts-dir <dir>', 'hosts.toml folder when config.toml sets no config_path (default /etc/containerd/certs.d)')
    .option('--mirror <url>', 'the peer mirror as the runtime reaches it', 'http://127.0.0.1:65001')
    .option(
      '--registry <host[:port],...>',
      'registries to pull through the mirror (repeatable; default: every registry, via _default)',
      collect,
      [],
    )
    .option('--insecure-registry <host[:port],...>', 'registries containerd falls back to over plain HTTP (repeatable)', collect, [])
    .option('--lazy', 'also add the Starling snapshotter and make the CRI plugin use it')
    .option('--snapshotter-socket <path>', "the snapshotter's gRPC socket (with --lazy)", '/run/starling/snapshotter.sock')
    .option('--registries-conf-dir <dir>', 'CRI-O/podman: write a registries.conf drop-in here (e.g. /etc/containers/registries.conf.d)')
    .option('--config-version <n>', 'version for a config.toml that is missing or empty: 2 (containerd 1.6/1.7) or 3 (2.x)')
    .option('--backup-dir <dir>', 'where the originals are kept for --undo (default: .starling-node-setup beside config.toml)')
    .option(
      '--restart-command <argv>',
      "how to restart containerd when config.toml changed (split on spaces; default: systemctl in PID 1's namespaces)",
    )
    .option('--no-restart', 'never restart containerd; say when it is needed')
    .option('--undo', 'restore every file node-setup changed, byte for byte')
    .option('--force', 'with --undo: restore even files someone changed since node-setup wrote them')
    .action(async (options: NodeSetupFlags) => {
      const restartCommand = options.restartCommand ? options.restartCommand.split(/\s+/).filter(Boolean) : undefined;
      let report: NodeSetupReport;
      try {
        if (options.undo) {
          report = await undoNodeSetup({
            containerdConfig: options.containerdConfig,
            registriesConfDir: options.registriesConfDir,
            backupDir: options.backupDir,
            force: Boolean(options.force),
            restart: options.restart,
            restartCommand,
          });
        } else {
          report = await setUpNode({
            containerdConfig: options.containerdConfig,
            hostsDir: options.hostsDir,
            mirror: options.mirror,
            registries: splitList(options.registry),
            insecureRegistries: splitList(options.insecureRegistry),
            lazy: options.lazy ? { snapshotterSocket: options.snapshotterSocket } : undefined,
            registriesConfDir: options.registriesConfDir,
            configVersion: parseConfigVersion(options.configVersion),
            backupDir: options.backupDir,
            restart: options.restart,
            restartCommand,
          });
        }
      } catch (error) {
        if (error instanceof NodeSetupError) throw new UserError(error.message);
        throw error;
      }
      for (const line of report.lines) console.log(line);
    });
}

/** Repeated flags whose values may also be comma-separated lists (a ConfigMap value may be empty). */
function splitList(values: string[]): string[] {
  return values
    .flatMap((value) => value.split(','))
    .map((value) => value.trim())
    .filter(Boolean);
}

function parseConfigVersion(value: string | undefined): 2 | 3 | undefined {
  if (value === undefined) return undefined;
  if (value === '2' || value === '3') return Number(value) as 2 | 3;
  throw new UserError(`--config-version: expected 2 or 3, got "${value}"`);
}

/** `starling node-labels`: writes this node's Kubernetes labels for `starling peer --labels-file`. */
export function registerNodeLabelsCommand(program: Command): void {
  program
    .command('node-labels')
    .description("write this node's Kubernetes labels (zone, rack, …) to a file for `starling peer --labels-file`")
    .requiredOption('--node <name>', "the node (in a pod: the downward API's spec.nodeName)")
    .requiredOption('--out <file>', 'where to write the labels (YAML)')
    .option('--rack-label <key>', 'the node label that names its rack; its value becomes the peer label "rack"')
    .option('--api-server <url>', 'the Kubernetes API (default: the in-cluster service)')
    .option('--token-file <file>', "bearer token (default: the pod's service account token)")
    .option('--ca-file <file>', "CA of the API server (default: the pod's service account ca.crt)")
    .action(async (options: NodeLabelsFlags) => {
      try {
        const labels = await fetchNodeLabels({
          node: options.node,
          apiServer: options.apiServer,
          tokenFile: options.tokenFile,
          caFile: options.caFile,
          rackLabel: options.rackLabel || undefined,
        });
        await writeNodeLabels(options.out, labels);
        console.log(
          `${options.out}: ${Object.keys(labels).length} labels of node ${options.node}${labels.rack ? ` (rack ${labels.rack})` : ''}`,
        );
      } catch (error) {
        if (error instanceof NodeSetupError) throw new UserError(error.message);
        throw error;
      }
    });
}
