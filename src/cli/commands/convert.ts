import { readFile } from 'node:fs/promises';
import type { Command } from 'commander';
import { UserError } from '../../common/errors.js';
import { convertImage } from '../../convert/convert.js';
import { parseLocation } from '../../convert/location.js';
import { openStore, sourceReference } from '../../convert/open.js';
import { parsePlatform } from '../../convert/platform.js';
import { Progress } from '../../convert/progress.js';
import { readRecording } from '../../convert/record.js';
import { DEFAULT_CHUNK_SIZE, DEFAULT_LEVEL, DEFAULT_ZSTD_LEVEL, MAX_ZSTD_LEVEL } from '../../estargz/index.js';
import { parseCredentials } from '../../oci/client.js';
import { RegistryHosts } from '../../oci/registry-hosts.js';
import { collect } from '../shared.js';

interface ConvertFlags {
  prioritizedFiles?: string;
  recordIn?: string;
  zstd?: boolean;
  chunkSize: string;
  level?: string;
  platform?: string;
  allPlatforms?: boolean;
  insecureRegistry: string[];
  srcCreds?: string;
  destCreds?: string;
  workers?: string;
}

/** `starling convert SRC DST`: an image (registry or OCI layout) rewritten as eStargz or zstd:chunked. */
export function registerConvertCommand(program: Command): void {
  program
    .command('convert')
    .description('Convert an image to eStargz (or zstd:chunked) layers; prints the new manifest digest')
    .argument('<src>', 'source image: registry/repo[:tag|@digest] or oci:DIR[:TAG]')
    .argument('<dst>', 'destination: registry/repo[:tag] or oci:DIR[:TAG]')
    .option('--prioritized-files <file>', 'paths to place first in the layers holding them (one per line)')
    .option('--record-in <file>', 'ctr-remote --record-out JSON lines: prioritize recorded paths per layer')
    .option('--zstd', 'make zstd:chunked layers instead of eStargz (gzip)')
    .option('--chunk-size <bytes>', 'largest file piece per compressed member', String(DEFAULT_CHUNK_SIZE))
    .option('--level <n>', `compression level (gzip 0-9, default ${DEFAULT_LEVEL}; zstd 1-${MAX_ZSTD_LEVEL}, default ${DEFAULT_ZSTD_LEVEL})`)
    .option('--platform <os/arch[/variant]>', 'manifest to convert from a multi-platform index (default: this host)')
    .option('--all-platforms', 'convert every manifest of an index and write a new index')
    .option('--insecure-registry <host:port>', 'reach this registry over plain HTTP (repeatable)', collect, [])
    .option('--src-creds <user:password>', 'credentials for the source registry')
    .option('--dest-creds <user:password>', 'credentials for the destination registry')
    .option('--workers <n>', 'compression threads (default: all cores)')
    .action(async (srcText: string, dstText: string, flags: ConvertFlags) => {
      if (flags.platform && flags.allPlatforms) throw new UserError('--platform and --all-platforms exclude each other');
      if (flags.prioritizedFiles && flags.recordIn) throw new UserError('--prioritized-files and --record-in exclude each other');
      const srcLocation = parseLocation(srcText, 'source');
      const dstLocation = parseLocation(dstText, 'destination');
      const platform = flags.platform ? parsePlatform(flags.platform) : undefined;
      const zstd = Boolean(flags.zstd);
      const level = flags.level === undefined ? undefined : integer(flags.level, '--level', zstd ? 1 : 0, zstd ? MAX_ZSTD_LEVEL : 9);
      const chunkSize = integer(flags.chunkSize, '--chunk-size', 1, Number.MAX_SAFE_INTEGER);
      const workers = flags.workers === undefined ? undefined : integer(flags.workers, '--workers', 1, 1024);
      const prioritizedFiles = flags.prioritizedFiles ? await readList(flags.prioritizedFiles) : undefined;
      const recording = flags.recordIn ? await readRecording(flags.recordIn) : undefined;
      const hosts = new RegistryHosts(flags.insecureRegistry);
      const src = openStore(srcLocation, hosts, flags.srcCreds ? parseCredentials(flags.srcCreds, '--src-creds') : undefined);
      const dst = openStore(dstLocation, hosts, flags.destCreds ? parseCredentials(flags.destCreds, '--dest-creds') : undefined);
      try {
        const result = await convertImage(src, await sourceReference(src), dst, dst.reference ?? 'latest', {
          compression: zstd ? 'zstd' : 'gzip', level, chunkSize, workers, prioritizedFiles, recording, platform,
          allPlatforms: flags.allPlatforms, progress: new Progress(),
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
  return text.split('\n').map((line) => line.trim()).filter((line) => line !== '');
}

function integer(text: string, flag: string, min: number, max: number): number {
  const value = Number(text);
  if (!/^\d+$/.test(text) || value < min || value > max) throw new UserError(`${flag} must be an integer from ${min} to ${max}, got "${text}"`);
  return value;
}
