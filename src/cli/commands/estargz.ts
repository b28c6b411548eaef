import { createReadStream, createWriteStream } from 'node:fs';
import { once } from 'node:events';
import { readFile, rm } from 'node:fs/promises';
import type { Command } from 'commander';
import { UserError } from '../../common/errors.js';
import {
  buildEstargz, fileSource, openEstargz, verifyEstargz, DEFAULT_CHUNK_SIZE, DEFAULT_LEVEL,
  type EstargzEntry, type RangeSource,
} from '../../estargz/index.js';

/**
 * `starling estargz build|verify|ls|cat`. Blobs are local files for now; every reader command
 * goes through a RangeSource, so a registry layer source can be added in openSource().
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
    .option('--level <n>', 'gzip level 0-9', String(DEFAULT_LEVEL))
    .option('--workers <n>', 'compression threads (default: all cores)')
    .option('--spool', 'copy the tar to a temporary file first (keeps only the last of duplicate names)')
    .option('--zstd', 'build zstd:chunked instead of gzip (not supported yet)')
    .action(async (input: string, output: string, opts: BuildFlags) => {
      if (opts.zstd) throw new UserError('--zstd: zstd:chunked layers are not supported yet; build a gzip eStargz instead');
      const prioritizedFiles = opts.prioritizedFiles ? await readPrioritizedList(opts.prioritizedFiles) : undefined;
      const options = {
        chunkSize: positiveInteger(opts.chunkSize, '--chunk-size'),
        level: integerInRange(opts.level, '--level', 0, 9),
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
    .argument('<blob>', 'eStargz blob')
    .option('--toc-digest <digest>', 'expected TOC digest (the layer annotation containerd.io/snapshot/stargz/toc.digest)')
    .action(async (blob: string, opts: { tocDigest?: string }) => {
      await withSource(blob, async (source) => {
        console.log(JSON.stringify(await verifyEstargz(source, { tocDigest: opts.tocDigest })));
      });
    });

  estargz
    .command('ls')
    .description('List the entries of a blob from its TOC')
    .argument('<blob>', 'eStargz blob')
    .option('--json', 'one JSON object per entry')
    .action(async (blob: string, opts: { json?: boolean }) => {
      await withSource(blob, async (source) => {
        const reader = await openEstargz(source);
        for (const entry of reader.entries) await writeOut(`${opts.json ? entryJson(entry) : entryLine(entry)}\n`);
      });
    });

  estargz
    .command('cat')
    .description('Write one file of a blob to stdout, fetching and verifying only its chunks')
    .argument('<blob>', 'eStargz blob')
    .argument('<path>', 'file inside the layer')
    .action(async (blob: string, path: string) => {
      await withSource(blob, async (source) => {
        const reader = await openEstargz(source);
        for await (const chunk of reader.fileChunks(path)) await writeOut(chunk);
      });
    });
}

interface BuildFlags {
  prioritizedFiles?: string;
  chunkSize: string;
  level: string;
  workers?: string;
  spool?: boolean;
  zstd?: boolean;
}

async function withSource(blob: string, use: (source: RangeSource) => Promise<void>): Promise<void> {
  const source = await openSource(blob);
  try {
    await use(source);
  } finally {
    await source.close?.();
  }
}

/** Where a blob argument is read from; registry references will be resolved here later. */
async function openSource(blob: string): Promise<RangeSource> {
  try {
    return await fileSource(blob);
  } catch (error) {
    throw new UserError(`cannot open ${blob}: ${(error as Error).message}`);
  }
}

async function readPrioritizedList(path: string): Promise<string[]> {
  const text = await readFile(path, 'utf8').catch((error: Error) => {
    throw new UserError(`cannot read --prioritized-files ${path}: ${error.message}`);
  });
  return text.split('\n').map((line) => line.trim()).filter((line) => line !== '');
}

function positiveInteger(text: string, flag: string): number {
  return integerInRange(text, flag, 1, Number.MAX_SAFE_INTEGER);
}

function integerInRange(text: string, flag: string, min: number, max: number): number {
  const value = Number(text);
  if (!/^\d+$/.test(text) || value < min || value > max) throw new UserError(`${flag} must be an integer from ${min} to ${max}, got "${text}"`);
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
