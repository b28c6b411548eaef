import { readFile } from 'node:fs/promises';
import type { Command } from 'commander';
import { UserError } from '../../common/errors.js';
import { convertImage } from '../../convert/convert.js';
import { parseLocation } from '../../convert/location.js';
import { openStore, sourceReference } from '../../convert/open.js';
import { parsePlatform, type Platform } from '../../convert/platform.js';
import { Progress } from '../../convert/progress.js';
import { readRecording } from '../../convert/record.js';
import { DEFAULT_CHUNK_SIZE, DEFAULT_LEVEL, DEFAULT_ZSTD_LEVEL, MAX_ZSTD_LEVEL } from '../../estargz/index.js';
import { parseCredentials, type Credentials } from '../../oci/client.js';
import { RegistryHosts } from '../../oci/registry-hosts.js';
import { collect } from '../shared.js';

/** Flags `convert` and `optimize` share: how layers are written and how registries are reached. */
export interface ConversionFlags {
  zstd?: boolean;
  chunkSize: string;
  level?: string;
  platform?: string;
  insecureRegistry: string[];
  srcCreds?: string;
  destCreds?: string;
  workers?: string;
}

interface ConvertFlags extends ConversionFlags {
  prioritizedFiles?: string;
  recordIn?: string;
  allPlatforms?: boolean;
}

/** Adds the shared conversion flags to a command. */
export function addConversionOptions(command: Command, platformHelp: string): Command {
  return command
    .option('--zstd', 'make zstd:chunked layers instead of eStargz (gzip)')
    .option('--chunk-size <bytes>', 'largest file piece per compressed member', String(DEFAULT_CHUNK_SIZE))
    .option(
      '--level <n>',
      `compression level (gzip 0-9, default ${DEFAULT_LEVEL}; zstd 1-${MAX_ZSTD_LEVEL}, default ${DEFAULT_ZSTD_LEVEL})`,
    )
    .option('--platform <os/arch[/variant]>', platformHelp)
    .option('--insecure-registry <host:port>', 'reach this registry over plain HTTP (repeatable)', collect, [])
    .option('--src-creds <user:password>', 'credentials for the source registry')
    .option('--dest-creds <user:password>', 'credentials for the destination registry')
    .option('--workers <n>', 'compression threads (default: all cores)');
}

export interface ConversionSettings {
  layer: { compression: 'gzip' | 'zstd'; level?: number; chunkSize: number; workers?: number };
  platform?: Platform;
  hosts: RegistryHosts;
  srcCredentials?: Credentials;
  dstCredentials?: Credentials;
}

/** Validates the shared conversion flags. */
export function conversionSettings(flags: ConversionFlags): ConversionSettings {
  const zstd = Boolean(flags.zstd);
  return {
    layer: {
      compression: zstd ? 'zstd' : 'gzip',
      level: flags.level === undefined ? undefined : integer(flags.level, '--level', zstd ? 1 : 0, zstd ? MAX_ZSTD_LEVEL : 9),
      chunkSize: integer(flags.chunkSize, '--chunk-size', 1, Number.MAX_SAFE_INTEGER),
      workers: flags.workers === undefined ? undefined : integer(flags.workers, '--workers', 1, 1024),
    },
    platform: flags.platform ? parsePlatform(flags.platform) : undefined,
    hosts: new RegistryHosts(flags.insecureRegistry),
    srcCredentials: flags.srcCreds ? parseCredentials(flags.srcCreds, '--src-creds') : undefined,
    dstCredentials: flags.destCreds ? parseCredentials(flags.destCreds, '--dest-creds') : undefined,
  };
}

/** `starling convert SRC DST`: an image (registry or OCI layout) rewritten as eStargz or zstd:chunked. */
export function registerConvertCommand(program: Command): void {
  const command = program
    .command('convert')
    .description('Convert an image to eStargz (or zstd:chunked) layers; prints the new manifest digest')
    .argument('<src>', 'source image: registry/repo[:tag|@digest] or oci:DIR[:TAG]')
    .argument('<dst>', 'destination: registry/repo[:tag] or oci:DIR[:TAG]')
    .option('--prioritized-files <file>', 'paths to place first in the layers holding them (one per line)')
    .option('--record-in <file>', 'ctr-remote --record-out JSON lines: prioritize recorded paths per layer');
  addConversionOptions(command, 'manifest to convert from a multi-platform index (default: this host)')
    .option('--all-platforms', 'convert every manifest of an index and write a new index')
    .action(async (srcText: string, dstText: string, flags: ConvertFlags) => {
      if (flags.platform && flags.allPlatforms) throw new UserError('--platform and --all-platforms exclude each other');
      if (flags.prioritizedFiles && flags.recordIn) throw new UserError('--prioritized-files and --record-in exclude each other');
      const srcLocation = parseLocation(srcText, 'source');
      const dstLocation = parseLocation(dstText, 'destination');
      const settings = conversionSettings(flags);
      const prioritizedFiles = flags.prioritizedFiles ? await readList(flags.prioritizedFiles) : undefined;
      const recording = flags.recordIn ? await readRecording(flags.recordIn) : undefined;
      const src = openStore(srcLocation, settings.hosts, settings.srcCredentials);
      const dst = openStore(dstLocation, settings.hosts, settings.dstCredentials);
      try {
        const result = await convertImage(src, await sourceReference(src), dst, dst.reference ?? 'latest', {
          ...settings.layer,
          prioritizedFiles,
          recording,
          platform: settings.platform,
          allPlatforms: flags.allPlatforms,
          progress: new Progress(),
        });
        if (result.missingPrioritized.length > 0) {
          console.error(`starling: warning: prioritized files found in no layer: ${result.missingPrioritized.join(', ')}`);
        }
        console.log(result.digest);
      } finally {
        await Promise.all([src.close(), dst.close()]);
      }
    });
}

async function readList(path: string): Promise<string[]> {
  const text = await readFile(path, 'utf8').catch((error: Error) => {
    throw new UserError(`cannot read --prioritized-files ${path}: ${error.message}`);
  });
  return text
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line !== '');
}

export function integer(text: string, flag: string, min: number, max: number): number {
  const value = Number(text);
  if (!/^\d+$/.test(text) || value < min || value > max)
    throw new UserError(`${flag} must be an integer from ${min} to ${max}, got "${text}"`);
  return value;
}
