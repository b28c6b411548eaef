// The realistic image of the lazy-start benchmarks: the Debian rootfs that
// test/snapshotter/debian.test.ts builds and caches (debootstrap minbase + python3), as a one-layer
// OCI image (umoci, gzip), converted to eStargz by `starling convert` and by `starling optimize` for
// one workload. Everything is cached in /var/tmp: building the plain image takes minutes.
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { debianRootfsCache } from '../../test/fixtures/debian-rootfs.js';
import { run, runOk, type RunResult } from '../../test/fixtures/processes.js';

export { DEBIAN_SUITE as SUITE } from '../../test/fixtures/debian-rootfs.js';
/** Where test/snapshotter/debian.test.ts caches the rootfs (debootstrap minbase + python3). */
export const ROOTFS_CACHE = debianRootfsCache(['python3']);
export const IMAGE_CACHE = `/var/tmp/starling-lazy-start-${createHash('sha256').update(ROOTFS_CACHE).digest('hex').slice(0, 12)}`;
/** The workload whose start-up the benchmarks time, and that `starling optimize` records. */
export const WORKLOAD = ['python3', '-c', 'import json, sqlite3'];
const CLI = path.resolve(import.meta.dirname, '../../dist/cli/main.js');

export interface OciLayer {
  digest: string;
  size: number;
  annotations?: Record<string, string>;
}

export interface DebianImages {
  /** The plain gzip image, tag `plain`. */
  plain: string;
  /** `starling convert`, tag `esgz`. */
  esgz: string;
  /** `starling optimize` for WORKLOAD, tag `optimized`. */
  optimized: string;
  /** The files WORKLOAD read while optimizing (ctr-remote's record format, one JSON line each). */
  record: string;
  /** Seconds each conversion took, when it ran now (NaN when reused). */
  convertSeconds: number;
  optimizeSeconds: number;
}

/** Fails with the command to run when the rootfs has not been built yet. */
export function requireRootfs(): void {
  if (!fs.existsSync(path.join(ROOTFS_CACHE, 'complete'))) {
    throw new Error(
      `no cached Debian rootfs in ${ROOTFS_CACHE}: run \`node --import tsx --test test/snapshotter/debian.test.ts\` once first`,
    );
  }
  if (!fs.existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npx tsc -p .\` first`);
}

export function rootfsPath(): string {
  return path.join(ROOTFS_CACHE, 'rootfs');
}

async function starling(args: string[], timeoutMs = 1_800_000): Promise<RunResult> {
  const res = await run(process.execPath, [CLI, ...args], { timeoutMs });
  if (res.code !== 0) throw new Error(`starling ${args.join(' ')} failed (${res.code}):\n${res.stderr}`);
  return res;
}

/** The plain one-layer image of the rootfs (umoci, gzip), cached. */
async function plainLayout(): Promise<string> {
  const layout = path.join(IMAGE_CACHE, 'oci');
  if (fs.existsSync(path.join(IMAGE_CACHE, 'complete'))) return layout;
  console.error(`building the plain image in ${layout} ...`);
  await fsp.rm(IMAGE_CACHE, { recursive: true, force: true });
  await fsp.mkdir(IMAGE_CACHE, { recursive: true });
  const bundle = path.join(IMAGE_CACHE, 'bundle');
  await runOk('umoci', ['init', '--layout', layout]);
  await runOk('umoci', ['new', '--image', `${layout}:plain`]);
  await runOk('umoci', ['unpack', '--image', `${layout}:plain`, bundle]);
  await runOk('cp', ['-a', `${rootfsPath()}/.`, path.join(bundle, 'rootfs')], { timeoutMs: 600_000 });
  await runOk('umoci', ['repack', '--image', `${layout}:plain`, bundle], { timeoutMs: 1_200_000 });
  await runOk('umoci', [
    'config',
    '--image',
    `${layout}:plain`,
    '--config.env',
    'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
  ]);
  await fsp.rm(bundle, { recursive: true, force: true });
  await fsp.writeFile(path.join(IMAGE_CACHE, 'complete'), new Date().toISOString());
  return layout;
}

/**
 * The three images. Converted and optimized into `workDir` every time unless `reuse` (then cached
 * next to the plain image and converted only once).
 */
export async function debianImages(workDir: string, reuse: boolean): Promise<DebianImages> {
  requireRootfs();
  const plain = await plainLayout();
  const converted = reuse ? IMAGE_CACHE : workDir;
  const esgz = path.join(converted, 'esgz');
  const optimized = path.join(converted, 'optimized');
  const record = path.join(converted, 'record.jsonl');
  let convertSeconds = NaN;
  let optimizeSeconds = NaN;
  if (!reuse || !fs.existsSync(path.join(converted, 'converted-complete'))) {
    await fsp.rm(esgz, { recursive: true, force: true });
    await fsp.rm(optimized, { recursive: true, force: true });
    let t = performance.now();
    await starling(['convert', `oci:${plain}:plain`, `oci:${esgz}:esgz`]);
    convertSeconds = (performance.now() - t) / 1000;
    t = performance.now();
    await starling([
      'optimize',
      `oci:${plain}:plain`,
      `oci:${optimized}:optimized`,
      '--entrypoint',
      JSON.stringify(WORKLOAD),
      '--args',
      '[]',
      '--record-out',
      record,
    ]);
    optimizeSeconds = (performance.now() - t) / 1000;
    if (reuse) await fsp.writeFile(path.join(converted, 'converted-complete'), new Date().toISOString());
  }
  return { plain, esgz, optimized, record, convertSeconds, optimizeSeconds };
}

/** The layers of the image tagged `tag` in an OCI layout. */
export async function layoutLayers(layout: string, tag: string): Promise<OciLayer[]> {
  const index = JSON.parse(await fsp.readFile(path.join(layout, 'index.json'), 'utf8')) as {
    manifests: Array<{ digest: string; annotations?: Record<string, string> }>;
  };
  const entry = index.manifests.find((m) => m.annotations?.['org.opencontainers.image.ref.name'] === tag);
  if (!entry) throw new Error(`${layout} has no tag ${tag}`);
  const manifest = JSON.parse(await fsp.readFile(path.join(layout, 'blobs/sha256', entry.digest.slice(7)), 'utf8')) as {
    layers: OciLayer[];
  };
  return manifest.layers.map(({ digest, size, annotations }) => ({ digest, size, annotations }));
}

/** The first layer of the image a layout holds under `tag` (the Debian image's is its root filesystem). */
export async function firstLayer(layout: string, tag: string): Promise<OciLayer> {
  const [layer] = await layoutLayers(layout, tag);
  if (!layer) throw new Error(`${layout}: the image tagged ${tag} has no layers`);
  return layer;
}

/** The paths a recording holds, in the order the workload opened them. */
export async function recordedPaths(record: string): Promise<string[]> {
  const lines = (await fsp.readFile(record, 'utf8')).split('\n').filter((l) => l.trim());
  return [...new Set(lines.map((l) => (JSON.parse(l) as { path: string }).path))];
}

/**
 * Reads `files` under `root` in order and digests each one's name, length and bytes: the lazy
 * reader over its mount and the bench over the original rootfs must get the same digest.
 */
export async function readFilesDigest(root: string, files: string[]): Promise<{ digest: string; bytes: number }> {
  const digest = createHash('sha256');
  let bytes = 0;
  for (const file of files) {
    const content = await fsp.readFile(path.join(root, file));
    digest.update(`${file}\0${content.length}\0`).update(content);
    bytes += content.length;
  }
  return { digest: digest.digest('hex'), bytes };
}
