import { createReadStream, createWriteStream, existsSync } from 'node:fs';
import { once } from 'node:events';
import { readFile, rm } from 'node:fs/promises';
import type { Command } from 'commander';
import { UserError } from '../../common/errors.js';
import {
  buildEstargz,
  fileSource,
  openEstargz,
  registryBlobSource,
  verifyEstargz,
  DEFAULT_CHUNK_SIZE,
  DEFAULT_LEVEL,
  DEFAULT_ZSTD_LEVEL,
  MAX_ZSTD_LEVEL,
  type EstargzEntry,
  type RangeSource,
} from '../../estargz/index.js';
import { parseCredentials, RegistryClient } from '../../oci/client.js';
import { parseImageReference } from '../../oci/reference.js';
import { RegistryHosts } from '../../oci/registry-hosts.js';
import { collect } from '../shared.js';

/**
 * `starling estargz build|verify|ls|cat`. Reader commands take a local file or a registry layer
 * (`registry/repo@sha256:...`), read through a RangeSource (pread, or HTTP Range requests).
 */
export function registerEstargzCommands(program: Command): void {
  const estargz = program.command('estargz').description('Build and inspect eStargz (lazily pullable) layers');

  estargz
    .command('build')
    .description('Convert a tar or tar.gz layer into an eStargz blob; prints its digests as JSON')
    .argument('<input>', 'layer tar or tar.gz')
    .argument('<output>', 'eStargz blob to write')
    .option('--prioritized-files <file>', 'file listing paths to place first (one per line), followed by .prefetch.landmark')
    .option('--chunk-size <bytes>', 'largest file piece per gzip member', String(DEFAULT_CHUNK_SIZE))
    .option('--level <n>', `gzip level 0-9 (default ${DEFAULT_LEVEL})`)
    .option('--workers <n>', 'compression threads (default: all cores)')
    .option('--spool', 'copy the tar to a temporary file first (keeps only the last of duplicate names)')
    .option('--zstd', `build zstd:chunked instead of gzip (--level 1-${MAX_ZSTD_LEVEL}, default ${DEFAULT_ZSTD_LEVEL})`)
    .action(async (input: string, output: string, opts: BuildFlags) => {
      const prioritizedFiles = opts.prioritizedFiles ? await readPrioritizedList(opts.prioritizedFiles) : undefined;
      const options = {
        chunkSize: positiveInteger(opts.chunkSize, '--chunk-size'),
        compression: opts.zstd ? ('zstd' as const) : ('gzip' as const),
        level: opts.zstd
          ? integerInRange(opts.level ?? String(DEFAULT_ZSTD_LEVEL), '--level', 1, MAX_ZSTD_LEVEL)
          : integerInRange(opts.level ?? String(DEFAULT_LEVEL), '--level', 0, 9),
        workers: opts.workers === undefined ? undefined : positiveInteger(opts.workers, '--workers'),
        prioritizedFiles,
        spool: opts.spool || undefined,
      };
      const out = createWriteStream(output);
      try {
        const result = await buildEstargz(createReadStream(input), out, options);
        console.log(JSON.stringify(result));
      } catch (error) {
        // Never leave a half-written blob behind; wait for the (lazily opened) file to close first.
        if (!out.closed) await once(out, 'close');
        await rm(output, { force: true });
        throw error;
      }
    });

  estargz
    .command('verify')
    .description('Check a blob completely: TOC digest, every chunk, and the tar stream against the TOC')
    .argument('<blob>', 'eStargz blob: a file, or a registry layer registry/repo@sha256:...')
    .option('--insecure-registry <host:port>', 'reach this registry over plain HTTP (repeatable)', collect, [])
    .option('--creds <user:password>', 'registry credentials')
    .option('--toc-digest <digest>', 'expected TOC digest (the layer annotation containerd.io/snapshot/stargz/toc.digest)')
    .action(async (blob: string, opts: { tocDigest?: string } & RegistryFlags) => {
      await withSource(blob, opts, async (source) => {
        console.log(JSON.stringify(await verifyEstargz(source, { tocDigest: opts.tocDigest })));
      });
    });

  estargz
    .command('ls')
    .description('List the entries of a blob from its TOC')
    .argument('<blob>', 'eStargz blob: a file, or a registry layer registry/repo@sha256:...')
    .option('--insecure-registry <host:port>', 'reach this registry over plain HTTP (repeatable)', collect, [])
    .option('--creds <user:password>', 'registry credentials')
    .option('--json', 'one JSON object per entry')
    .action(async (blob: string, opts: { json?: boolean } & RegistryFlags) => {
      await withSource(blob, opts, async (source) => {
        const reader = await openEstargz(source);
        for (const entry of reader.entries) await writeOut(`${opts.json ? entryJson(entry) : entryLine(entry)}\n`);
      });
    });

  estargz
    .command('cat')
    .description('Write one file of a blob to stdout, fetching and verifying only its chunks')
    .argument('<blob>', 'eStargz blob: a file, or a registry layer registry/repo@sha256:...')
    .option('--insecure-registry <host:port>', 'reach this registry over plain HTTP (repeatable)', collect, [])
    .option('--creds <user:password>', 'registry credentials')
    .argument('<path>', 'file inside the layer')
    .action(async (blob: string, path: string, opts: RegistryFlags) => {
      await withSource(blob, opts, async (source) => {
        const reader = await openEstargz(source);
        for await (const chunk of reader.fileChunks(path)) await writeOut(chunk);
      });
    });
}

interface BuildFlags {
  prioritizedFiles?: string;
  chunkSize: string;
  level?: string;
  workers?: string;
  spool?: boolean;
  zstd?: boolean;
}

interface RegistryFlags {
  insecureRegistry: string[];
  creds?: string;
}

async function withSource(blob: string, flags: RegistryFlags, use: (source: RangeSource) => Promise<void>): Promise<void> {
  if (existsSync(blob) || !blob.includes('@')) {
    const source = await fileSource(blob).catch((error: Error) => {
      throw new UserError(`cannot open ${blob}: ${error.message}`);
    });
    try {
      await use(source);
    } finally {
      await source.close();
    }
    return;
  }
  // Not a file, and it has a digest: a registry layer, read with Range requests.
  let ref;
  try {
    ref = parseImageReference(blob);
  } catch (error) {
    throw new UserError(`${blob} is neither a file nor a registry layer reference: ${(error as Error).message}`);
  }
  if (!ref.digest || ref.tag) throw new UserError(`registry layer ${blob} must be registry/repository@sha256:<digest>`);
  const client = new RegistryClient(ref.registry, {
    hosts: new RegistryHosts(flags.insecureRegistry),
    credentials: flags.creds ? parseCredentials(flags.creds) : undefined,
  });
  try {
    await use(await registryBlobSource(client, ref.repository, ref.digest));
  } finally {
    await client.close();
  }
}

async function readPrioritizedList(path: string): Promise<string[]> {
  const text = await readFile(path, 'utf8').catch((error: Error) => {
    throw new UserError(`cannot read --prioritized-files ${path}: ${error.message}`);
  });
  return text
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line !== '');
}

function positiveInteger(text: string, flag: string): number {
  return integerInRange(text, flag, 1, Number.MAX_SAFE_INTEGER);
}

function integerInRange(text: string, flag: string, min: number, max: number): number {
  const value = Number(text);
  if (!/^\d+$/.test(text) || value < min || value > max)
    throw new UserError(`${flag} must be an integer from ${min} to ${max}, got "${text}"`);
  return value;
}

function entryLine(entry: EstargzEntry): string {
  const mode = (entry.mode & 0o7777).toString(8).padStart(4, '0');
  const link = entry.linkName ? ` -> ${entry.linkName}` : '';
  return `${entry.type.padEnd(8)} ${mode} ${entry.uid}/${entry.gid} ${String(entry.size).padStart(10)} ${entry.modtime || '-'} ${entry.name || '.'}${link}`;
}

function entryJson(entry: EstargzEntry): string {
  const { chunks, xattrs, ...rest } = entry;
  return JSON.stringify({
    ...rest,
    xattrs: Object.fromEntries(Object.entries(xattrs).map(([k, v]) => [k, v.toString('base64')])),
    chunks: chunks.map(({ offset, chunkOffset, chunkSize, digest }) => ({ offset, chunkOffset, chunkSize, digest })),
  });
}

async function writeOut(data: string | Buffer): Promise<void> {
  if (!process.stdout.write(data)) await once(process.stdout, 'drain');
}
