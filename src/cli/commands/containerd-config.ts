import type { Command } from 'commander';
import { UserError } from '../../common/errors.js';
import { writeHostsToml } from '../../peer/containerd-hosts.js';
import { collect } from '../shared.js';

/** The flags of `starling containerd-config` as commander parses them. */
interface ContainerdConfigFlags {
  hostsDir: string;
  mirror: string;
  registry: string[];
  insecureRegistry: string[];
  default: boolean;
}

export function registerContainerdConfigCommand(program: Command): void {
  program
    .command('containerd-config')
    .description('write containerd hosts.toml files that send pulls through the local Starling peer')
    .option('--hosts-dir <dir>', "containerd's registry config_path", '/etc/containerd/certs.d')
    .option('--mirror <url>', 'the peer mirror as containerd reaches it', 'http://127.0.0.1:65001')
    .option('--registry <host:port>', 'a registry to route through the mirror (repeatable)', collect, [])
    .option('--insecure-registry <host:port>', 'a registry that containerd reaches over plain HTTP (repeatable)', collect, [])
    .option('--no-default', 'do not write _default/hosts.toml (only the named registries use the mirror)')
    .action(async (options: ContainerdConfigFlags) => {
      const registries = [...new Set([...options.registry, ...options.insecureRegistry])];
      if (!registries.length && !options.default) throw new UserError('nothing to write: name a --registry or keep _default');
      let files: string[];
      try {
        files = await writeHostsToml({
          hostsDir: options.hostsDir,
          mirrorUrl: options.mirror,
          registries,
          insecure: options.insecureRegistry,
          includeDefault: options.default,
        });
      } catch (error) {
        throw new UserError((error as Error).message);
      }
      for (const file of files) console.log(`wrote ${file}`);
      console.log(
        `\ncontainerd: set [plugins."io.containerd.grpc.v1.cri".registry] config_path = "${options.hostsDir}"` +
          `\nctr: pass --hosts-dir ${options.hostsDir}`,
      );
    });
}
