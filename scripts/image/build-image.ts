// Builds Starling's container image from this repository with Debian packages and npm only: an OCI
// image layout with four layers (Debian's C/C++ runtime, FUSE and busybox; the machine's Node 20
// binary; production node_modules with the native addons; dist/), one image for every component,
// chosen by its command (`starling peer`, `starling manager`, …). Reproducible for a commit: every
// layer is a sorted tar with fixed times and owners. Cached under /var/tmp by a hash of its inputs.
//
//   node --import tsx scripts/image/build-image.ts [--tag T] [--out DIR] [--push REF [--dest-tls-verify=false]] [--no-cache]

import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { cp, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { LayoutStore } from '../../src/convert/layout-store.js';
import { MediaType } from '../../src/oci/media-types.js';
import { APP_DIR, appEntries, baseEntries, IMAGE_USER, LAYER_MTIME, moduleEntries, nodeEntries } from './contents.js';
import { gatherInputs, type Inputs } from './inputs.js';
import { writeLayer, type WrittenLayer } from './layer-tar.js';

export { IMAGE_USER } from './contents.js';

const run = promisify(execFile);
export const DEFAULT_CACHE = '/var/tmp/starling-image';

export interface BuildImageOptions {
  tag?: string;
  /** Where the cache lives (default /var/tmp/starling-image); each build is a folder named by its inputs' hash. */
  cacheDir?: string;
  /** Rebuild even when a build of the same inputs is cached. */
  noCache?: boolean;
  log?: (line: string) => void;
}

export interface BuiltStarlingImage {
  layoutDir: string;
  tag: string;
  /** `oci:<layoutDir>:<tag>`, for skopeo and `starling convert`. */
  ociRef: string;
  manifestDigest: string;
  layers: Array<{ name: string; digest: string; size: number }>;
  /** Compressed bytes of every layer plus the config. */
  size: number;
  /** Whether this came from the cache. */
  cached: boolean;
}

export async function buildStarlingImage(options: BuildImageOptions = {}): Promise<BuiltStarlingImage> {
  const log = options.log ?? (() => {});
  const tag = options.tag ?? 'latest';
  const cacheDir = options.cacheDir ?? DEFAULT_CACHE;
  const inputs = await gatherInputs(log);
  const key = createHash('sha256')
    .update(JSON.stringify({ ...inputs, tag }))
    .digest('hex')
    .slice(0, 24);
  const buildDir = join(cacheDir, key);
  const resultFile = join(buildDir, 'build.json');
  if (!options.noCache && existsSync(resultFile)) {
    log(`cached: ${buildDir}`);
    return { ...(JSON.parse(await readFile(resultFile, 'utf8')) as BuiltStarlingImage), cached: true };
  }
  await rm(buildDir, { recursive: true, force: true });
  await mkdir(buildDir, { recursive: true });
  const staging = await mkdtemp(join(buildDir, 'staging-'));
  try {
    const layerDir = join(staging, 'layers');
    await mkdir(layerDir);
    const layers: Array<{ name: string; written: WrittenLayer; file: string }> = [];
    for (const [name, entries] of [
      ['base', await baseEntries(cacheDir, staging, inputs.packages, log)],
      ['node', await nodeEntries(staging)],
      ['modules', await moduleEntries(staging, log)],
      ['app', await appEntries()],
    ] as const) {
      const file = join(layerDir, `${name}.tar.gz`);
      const written = await writeLayer(entries, file, LAYER_MTIME);
      log(`layer ${name}: ${mib(written.size)} compressed (${written.digest})`);
      layers.push({ name, written, file });
    }
    const layoutDir = join(buildDir, 'oci');
    const store = new LayoutStore(layoutDir);
    for (const layer of layers) await store.putBlob({ digest: layer.written.digest, size: layer.written.size }, async () => layer.file);
    const config = Buffer.from(JSON.stringify(imageConfig(inputs, layers, new Date(inputs.sourceDateEpoch * 1000))));
    const configFile = join(staging, 'config.json');
    await writeFile(configFile, config);
    const configDigest = `sha256:${createHash('sha256').update(config).digest('hex')}`;
    await store.putBlob({ digest: configDigest, size: config.length }, async () => configFile);
    const manifest = {
      schemaVersion: 2,
      mediaType: MediaType.OciManifest,
      config: { mediaType: MediaType.OciConfig, digest: configDigest, size: config.length },
      layers: layers.map((l) => ({ mediaType: MediaType.OciLayerGzip, digest: l.written.digest, size: l.written.size })),
    };
    const manifestDigest = await store.putManifest(Buffer.from(JSON.stringify(manifest)), MediaType.OciManifest, tag);
    const result: BuiltStarlingImage = {
      layoutDir,
      tag,
      ociRef: `oci:${layoutDir}:${tag}`,
      manifestDigest,
      layers: layers.map((l) => ({ name: l.name, digest: l.written.digest, size: l.written.size })),
      size: layers.reduce((sum, l) => sum + l.written.size, config.length),
      cached: false,
    };
    await writeFile(resultFile, JSON.stringify(result, null, 2));
    await pruneCache(cacheDir, KEPT_BUILDS);
    return result;
  } finally {
    await rm(staging, { recursive: true, force: true });
  }
}

function imageConfig(inputs: Inputs, layers: Array<{ name: string; written: WrittenLayer }>, mtime: Date) {
  const created = mtime.toISOString();
  return {
    created,
    architecture: 'amd64',
    os: 'linux',
    config: {
      User: `${IMAGE_USER.uid}:${IMAGE_USER.gid}`,
      Env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'NODE_ENV=production'],
      Entrypoint: ['/usr/local/bin/node', `${APP_DIR}/dist/cli/main.js`],
      Cmd: ['--help'],
      WorkingDir: APP_DIR,
      Labels: {
        'org.opencontainers.image.title': 'starling',
        'org.opencontainers.image.revision': inputs.revision,
        'org.opencontainers.image.created': created,
      },
    },
    rootfs: { type: 'layers', diff_ids: layers.map((l) => l.written.diffId) },
    history: layers.map((l) => ({ created, created_by: `scripts/image/build-image.ts: ${l.name}` })),
  };
}

// ---------------------------------------------------------------- helpers

/** Builds kept in the cache (each about 140 MB): the newest few, so switching branches stays cheap. */
const KEPT_BUILDS = 3;

async function pruneCache(cacheDir: string, keep: number): Promise<void> {
  const builds = [];
  for (const name of await readdir(cacheDir)) {
    const result = join(cacheDir, name, 'build.json');
    if (existsSync(result)) builds.push({ dir: join(cacheDir, name), mtime: (await stat(result)).mtimeMs });
  }
  builds.sort((a, b) => b.mtime - a.mtime);
  for (const old of builds.slice(keep)) await rm(old.dir, { recursive: true, force: true });
}

function mib(bytes: number): string {
  return `${(bytes / 2 ** 20).toFixed(1)} MiB`;
}

/** Copies the layout to a registry with skopeo (Debian's). */
export async function pushImage(image: BuiltStarlingImage, ref: string, tlsVerify: boolean): Promise<void> {
  await run('skopeo', ['copy', '--quiet', `--dest-tls-verify=${tlsVerify}`, image.ociRef, `docker://${ref}`], { maxBuffer: 64 << 20 });
}

async function main(argv: string[]): Promise<void> {
  const flag = (name: string) => {
    const i = argv.indexOf(name);
    return i >= 0 ? argv[i + 1] : undefined;
  };
  const started = Date.now();
  const image = await buildStarlingImage({
    tag: flag('--tag'),
    cacheDir: flag('--cache-dir'),
    noCache: argv.includes('--no-cache'),
    log: (line) => console.error(line),
  });
  const push = flag('--push');
  if (push) await pushImage(image, push, !argv.includes('--dest-tls-verify=false'));
  const out = flag('--out');
  if (out) await cp(image.layoutDir, out, { recursive: true });
  console.log(
    [
      `image ${image.ociRef}${image.cached ? ' (cached)' : ''} in ${((Date.now() - started) / 1000).toFixed(1)} s`,
      `manifest ${image.manifestDigest}`,
      ...image.layers.map((l) => `  ${l.name.padEnd(8)} ${mib(l.size).padStart(10)}  ${l.digest}`),
      `size ${mib(image.size)} compressed`,
      ...(push ? [`pushed to ${push}`] : []),
      ...(out ? [`copied to ${out}`] : []),
    ].join('\n'),
  );
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2)).catch((error: Error) => {
    console.error(`build-image: ${error.message}`);
    process.exit(1);
  });
}
