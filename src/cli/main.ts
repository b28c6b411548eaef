#!/usr/bin/env node
import { Command, CommanderError } from 'commander';
import { UserError } from '../common/errors.js';
import { registerCertsCommand } from './commands/certs.js';
import { registerEstargzCommands } from './commands/estargz.js';
import { registerContainerdConfigCommand } from './commands/containerd-config.js';
import { registerConvertCommand } from './commands/convert.js';
import { registerGetCommand } from './commands/get.js';
import { registerManagerCommand } from './commands/manager.js';
import { registerNodeLabelsCommand, registerNodeSetupCommand } from './commands/node-setup.js';
import { registerOptimizeCommand } from './commands/optimize.js';
import { registerPeerCommand } from './commands/peer.js';
import { registerSchedulerCommand } from './commands/scheduler.js';
import { registerFuseServerCommand, registerSnapshotterCommand } from './commands/snapshotter.js';
import { registerStatCommand } from './commands/stat.js';
import { registerUpCommand } from './commands/up.js';

const program = new Command();
program.name('starling').description('Peer-to-peer container-image distribution with lazy pulling').version('0.1.0').showHelpAfterError();

// Each subcommand lives in its own module under cli/commands/ and registers itself here.
registerEstargzCommands(program);
registerConvertCommand(program);
registerOptimizeCommand(program);
registerPeerCommand(program);
registerSchedulerCommand(program);
registerManagerCommand(program);
registerSnapshotterCommand(program);
registerFuseServerCommand(program);
registerContainerdConfigCommand(program);
registerNodeSetupCommand(program);
registerNodeLabelsCommand(program);
registerGetCommand(program);
registerStatCommand(program);
registerUpCommand(program);
registerCertsCommand(program);

try {
  await program.parseAsync(process.argv);
} catch (error) {
  if (error instanceof CommanderError) process.exit(error.exitCode);
  if (error instanceof UserError) {
    console.error(`starling: ${error.message}`);
    process.exit(2);
  }
  console.error(error);
  process.exit(1);
}
