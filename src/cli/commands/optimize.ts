import type { Command } from 'commander';
import { UserError } from '../../common/errors.js';
import { parseLocation } from '../../convert/location.js';
import { openStore, sourceReference } from '../../convert/open.js';
import { Progress } from '../../convert/progress.js';
import { requireFuseAddon } from '../../fuse/index.js';
import { DEFAULT_PERIOD_MS, optimizeImage, parseJsonArgv } from '../../optimize/index.js';
import { collect } from '../shared.js';
import { addConversionOptions, conversionSettings, type ConversionFlags } from './convert.js';

interface OptimizeFlags extends ConversionFlags {
  entrypoint?: string;
  args?: string;
  env: string[];
  user?: string;
  cwd?: string;
  period: string;
  netHost?: boolean;
  recordOut?: string;
  tmpDir?: string;
}

const INTERRUPTS = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;

/**
 * `starling optimize SRC DST`: runs the image's workload in a sandbox over lazily mounted layers,
 * records the files it reads and converts the image with them first (ctr-remote image optimize).
 */
export function registerOptimizeCommand(program: Command): void {
  const command = program
    .command('optimize')
    .description(
      "Run the image's workload in a sandbox (namespaces + chroot over lazily mounted layers), record the files it reads, " +
        'and convert the image with them prioritized; prints the new manifest digest. Needs root.',
    )
    .argument('<src>', 'source image: registry/repo[:tag|@digest] or oci:DIR[:TAG] (any layer format)')
    .argument('<dst>', 'destination: registry/repo[:tag] or oci:DIR[:TAG]')
    .option(
      '--entrypoint <json>',
      'entrypoint replacing the image\'s, as a JSON array, e.g. \'["python3","-c","import json"]\'; the image\'s Cmd (or --args) follows it, as in ctr-remote',
    )
    .option('--args <json>', "arguments replacing the image's Cmd, as a JSON array")
    .option('--env <KEY=VALUE>', "environment variable added to or replacing the image's (repeatable)", collect, [])
    .option('--user <user[:group]>', "user replacing the image's (names are looked up in the image)")
    .option('--cwd <dir>', "working directory replacing the image's")
    .option('--period <seconds>', 'stop the workload after this long if it has not exited', String(DEFAULT_PERIOD_MS / 1000))
    .option('--net-host', "share the host's network (default: a private network namespace with only lo)")
    .option('--record-out <file>', "write the record in ctr-remote's format (for `starling convert --record-in`)")
    .option('--tmp-dir <dir>', 'where the work dir goes (unoptimized layers, chunk cache, overlay upper)');
  addConversionOptions(command, 'manifest to optimize from a multi-platform index (default: this host)').action(
    async (srcText: string, dstText: string, flags: OptimizeFlags) => {
      requireFuseAddon(); // the workload runs over lazily mounted layers
      const srcLocation = parseLocation(srcText, 'source');
      const dstLocation = parseLocation(dstText, 'destination');
      const settings = conversionSettings(flags);
      const period = Number(flags.period);
      if (!/^\d+(\.\d+)?$/.test(flags.period) || !(period > 0) || period > 86_400) {
        throw new UserError(`--period must be a number of seconds above 0 (at most 86400), got "${flags.period}"`);
      }
      // Bad JSON is reported before anything is pulled or mounted.
      if (flags.entrypoint !== undefined) parseJsonArgv(flags.entrypoint, '--entrypoint');
      if (flags.args !== undefined) parseJsonArgv(flags.args, '--args');

      // Ctrl-C (or SIGTERM/SIGHUP): kill the workload, unmount, remove the work dir, then exit.
      // A second signal exits at once (the exit hook still detaches the mounts).
      const abort = new AbortController();
      let received: NodeJS.Signals | undefined;
      const onSignal = (signal: NodeJS.Signals) => {
        if (received) process.exit(130);
        received = signal;
        console.error(`starling: ${signal}: stopping the workload and cleaning up`);
        abort.abort(new UserError(`interrupted by ${signal}`));
      };
      for (const signal of INTERRUPTS) process.on(signal, onSignal);

      const src = openStore(srcLocation, settings.hosts, settings.srcCredentials);
      const dst = openStore(dstLocation, settings.hosts, settings.dstCredentials);
      try {
        const result = await optimizeImage(src, await sourceReference(src), dst, dst.reference ?? 'latest', {
          workload: { entrypoint: flags.entrypoint, args: flags.args, env: flags.env, user: flags.user, cwd: flags.cwd },
          periodMs: period * 1000,
          network: flags.netHost ? 'host' : 'private',
          recordOut: flags.recordOut,
          convert: { ...settings.layer, platform: settings.platform, progress: new Progress() },
          tmpDir: flags.tmpDir,
          signal: abort.signal,
        });
        console.log(result.digest);
      } finally {
        await Promise.all([src.close(), dst.close()]);
        for (const signal of INTERRUPTS) process.removeListener(signal, onSignal);
        if (received) process.exit(130); // cleaned up; the signal was reported when it came
      }
    },
  );
}
