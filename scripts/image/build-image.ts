// Builds Starling's container image from this repository with Debian packages and npm only: an OCI
// image layout with four layers (Debian's C/C++ runtime, FUSE and busybox; the machine's Node 20
// binary; production node_modules with the native addons; dist/), one image for every component,
// chosen by its command (`starling peer`, `starling manager`, …). Reproducible for a commit: every
// layer is a sorted tar with fixed times and owners. Cached under /var/tmp by a hash of its inputs.
//
//   node --import tsx scripts/image/build-image.ts [--tag T] [--out DIR] [--push REF [--dest-tls-verify=false]] [--no-cache]

import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { cp, mkdir, mkdtemp, readdir, readFile, readlink, realpath, rm, stat, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { LayoutStore } from '../../src/convert/layout-store.js';
import { MediaType } from '../../src/oci/media-types.js';
import { addTree, writeLayer, type LayerEntry, type WrittenLayer } from './layer-tar.js';

const run = promisify(execFile);
const REPO = resolve(fileURLToPath(new URL('../..', import.meta.url)));
export const DEFAULT_CACHE = '/var/tmp/starling-image';

/** Debian packages in the base layer: what node, the native addons and node-setup's restart need at run time. */
const DEBIAN_PACKAGES = ['libc6', 'libgcc-s1', 'libstdc++6', 'libfuse3-3', 'busybox-static'];
/** busybox applets linked in /bin: a shell for debugging, nsenter for node-setup's restart, mount tools for the snapshotter. */
const BUSYBOX_APPLETS = ['sh', 'nsenter', 'mount', 'umount', 'ls', 'cat', 'ps', 'kill', 'sleep', 'env', 'id'];
/** The non-root user the manager and the scheduler run as (the peer and snapshotter need root). */
export const IMAGE_USER = { uid: 65532, gid: 65532, name: 'starling' };
const APP_DIR = '/opt/starling';
const NATIVE_ADDONS = ['digest', 'fuse', 'sendfile'];
/**
 * Every file's time in every layer: fixed rather than the commit's, so a layer whose files did not
 * change keeps its digest across commits and a node upgrading Starling fetches only what changed
 * (usually the 0.3 MiB app layer). The config's `created` is the commit's time.
 */
const LAYER_MTIME = new Date('2020-01-01T00:00:00Z');

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
  const key = createHash('sha256').update(JSON.stringify({ ...inputs, tag })).digest('hex').slice(0, 24);
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

// ---------------------------------------------------------------- inputs (the cache key)

interface Inputs {
  packages: Array<{ name: string; version: string }>;
  node: { path: string; sha256: string };
  lockfile: string;
  /** sha256 of every file that goes into the modules and app layers, by path. */
  files: string;
  builder: string;
  sourceDateEpoch: number;
  revision: string;
}

async function gatherInputs(log: (line: string) => void): Promise<Inputs> {
  const packages = [];
  for (const name of DEBIAN_PACKAGES) {
    const { stdout } = await run('dpkg-query', ['-W', '-f', '${Version}', name]).catch(() => ({ stdout: '' }));
    if (!stdout) throw new Error(`Debian package ${name} is not installed: run scripts/install-deps.sh`);
    packages.push({ name, version: stdout.trim() });
  }
  if (!existsSync(join(REPO, 'dist/cli/main.js'))) throw new Error('dist/ is not built: run npm run build first');
  await buildNativeAddons(log);
  const nodePath = await realpath(process.execPath);
  const files = createHash('sha256');
  for (const dir of ['dist', 'console/dist', 'proto', 'native', 'node_modules']) {
    for (const file of await listFiles(join(REPO, dir))) {
      if (dir === 'native' && !file.endsWith('.node')) continue;
      files.update(`${dir}/${file}\0`).update(await fileHash(join(REPO, dir, file)));
    }
  }
  const builder = createHash('sha256');
  for (const file of (await readdir(fileURLToPath(new URL('.', import.meta.url)))).sort()) {
    builder.update(await readFile(fileURLToPath(new URL(file, import.meta.url))));
  }
  const git = await run('git', ['-C', REPO, 'log', '-1', '--format=%ct %H']).catch(() => ({ stdout: '' }));
  const [epoch, revision] = git.stdout.trim().split(' ');
  return {
    packages,
    node: { path: nodePath, sha256: await fileHash(nodePath) },
    lockfile: await fileHash(join(REPO, 'package-lock.json')),
    files: files.digest('hex'),
    builder: builder.digest('hex'),
    sourceDateEpoch: Number(process.env.SOURCE_DATE_EPOCH ?? epoch ?? 0),
    revision: revision ?? 'unknown',
  };
}

/** The project's own addons are optional at install time: the image needs every one built. */
async function buildNativeAddons(log: (line: string) => void): Promise<void> {
  for (const name of NATIVE_ADDONS) {
    const release = join(REPO, 'native', name, 'build', 'Release');
    const built = existsSync(release) && (await readdir(release)).some((f) => f.endsWith('.node'));
    if (built) continue;
    log(`building native/${name}`);
    await run('npm', ['run', `build:${name}`], { cwd: REPO, maxBuffer: 64 << 20 });
  }
}

// ---------------------------------------------------------------- layers

/** Debian's runtime libraries, libfuse3 and busybox, from their .deb files (kept under the cache). */
async function baseEntries(cacheDir: string, staging: string, packages: Inputs['packages'], log: (line: string) => void): Promise<Map<string, LayerEntry>> {
  const debDir = join(cacheDir, 'debs');
  await mkdir(debDir, { recursive: true });
  const root = join(staging, 'base');
  await mkdir(root);
  for (const { name, version } of packages) {
    const deb = join(debDir, `${name}_${version.replace(/:/g, '%3a')}_amd64.deb`);
    if (!existsSync(deb)) {
      log(`apt-get download ${name}=${version}`);
      await run('apt-get', ['download', `${name}=${version}`], { cwd: debDir });
    }
    await run('dpkg-deb', ['-x', deb, root]);
  }
  const entries = new Map<string, LayerEntry>();
  // Documentation, manuals, translations and iconv's converters: nothing Starling reads.
  const dropped = /^(usr\/share\/(doc|man|info|locale|lintian|bug)|usr\/lib\/x86_64-linux-gnu\/gconv)(\/|$)/;
  await addTree(entries, root, '/', (relative) => !dropped.test(relative));
  for (const applet of BUSYBOX_APPLETS) entries.set(`/bin/${applet}`, { type: 'symlink', path: `/bin/${applet}`, target: 'busybox' });
  const user = IMAGE_USER;
  const etc = join(staging, 'etc');
  await mkdir(etc);
  await writeFile(join(etc, 'passwd'), `root:x:0:0:root:/root:/bin/sh\n${user.name}:x:${user.uid}:${user.gid}:${user.name}:/var/lib/starling:/bin/false\n`);
  await writeFile(join(etc, 'group'), `root:x:0:\n${user.name}:x:${user.gid}:\n`);
  for (const name of ['passwd', 'group']) {
    entries.set(`/etc/${name}`, { type: 'file', path: `/etc/${name}`, mode: 0o644, source: join(etc, name), size: (await stat(join(etc, name))).size });
  }
  entries.set('/tmp', { type: 'dir', path: '/tmp', mode: 0o1777 });
  entries.set('/root', { type: 'dir', path: '/root', mode: 0o700 });
  // The default data folder, writable by the non-root user when no volume is mounted there.
  entries.set('/var/lib/starling', { type: 'dir', path: '/var/lib/starling', mode: 0o755, uid: user.uid, gid: user.gid });
  return entries;
}

/** The machine's Node 20 binary (a single file on this machine kind), without its debug symbols. */
async function nodeEntries(staging: string): Promise<Map<string, LayerEntry>> {
  const binary = join(staging, 'node');
  // strip (binutils, which node-gyp's toolchain brings) takes 99 MB to 86 MB: 31 MB gzip'd.
  await run('strip', ['-o', binary, await realpath(process.execPath)]);
  const entries = new Map<string, LayerEntry>();
  entries.set('/usr/local/bin/node', { type: 'file', path: '/usr/local/bin/node', mode: 0o755, source: binary, size: (await stat(binary)).size });
  return entries;
}

/** Production node_modules (npm prune --omit=dev of the built tree) and the project's native addons. */
async function moduleEntries(staging: string, log: (line: string) => void): Promise<Map<string, LayerEntry>> {
  const dir = join(staging, 'modules');
  await mkdir(dir);
  for (const file of ['package.json', 'package-lock.json']) await cp(join(REPO, file), join(dir, file));
  await cp(join(REPO, 'node_modules'), join(dir, 'node_modules'), { recursive: true, verbatimSymlinks: true });
  log('npm prune --omit=dev');
  await run('npm', ['prune', '--omit=dev', '--ignore-scripts', '--no-audit', '--no-fund'], { cwd: dir, maxBuffer: 64 << 20 });
  const entries = new Map<string, LayerEntry>();
  await addTree(entries, join(dir, 'node_modules'), `${APP_DIR}/node_modules`, keepModuleFile);
  for (const name of NATIVE_ADDONS) {
    await addTree(entries, join(REPO, 'native', name, 'build', 'Release'), `${APP_DIR}/native/${name}/build/Release`, (rel, isDir) => !isDir && rel.endsWith('.node'));
  }
  return entries;
}

/**
 * What a running Starling needs from node_modules: no compiler inputs or outputs besides the built
 * `.node` files, no type declarations, source maps or docs. (better-sqlite3's sources alone are 9 MB.)
 */
function keepModuleFile(relative: string, isDir: boolean): boolean {
  const parts = relative.split('/');
  const packageDepth = parts[0]?.startsWith('@') ? 2 : 1;
  const inside = parts.slice(packageDepth);
  // A package built by node-gyp: its build/ holds objects beside the .node, deps/ and src/ its C sources.
  const native = existsSync(join(REPO, 'node_modules', ...parts.slice(0, packageDepth), 'binding.gyp'));
  if (native && inside[0] === 'build') return isDir ? !/^(obj|obj\.target|\.deps|deps)$/.test(inside[1] ?? '') : relative.endsWith('.node');
  if (native && (inside[0] === 'deps' || inside[0] === 'src')) return false;
  if (parts[0] === '.bin') return false;
  return isDir || !/(\.d\.ts|\.d\.mts|\.d\.cts|\.map|\.md|\.markdown)$/i.test(relative) || /license/i.test(relative);
}

/** dist/, the console, the .proto files the gRPC services load, and package.json. */
async function appEntries(): Promise<Map<string, LayerEntry>> {
  const entries = new Map<string, LayerEntry>();
  await addTree(entries, join(REPO, 'dist'), `${APP_DIR}/dist`, (rel) => !rel.endsWith('.map'));
  await addTree(entries, join(REPO, 'console', 'dist'), `${APP_DIR}/console/dist`);
  await addTree(entries, join(REPO, 'proto'), `${APP_DIR}/proto`);
  entries.set(`${APP_DIR}/package.json`, { type: 'file', path: `${APP_DIR}/package.json`, mode: 0o644, source: join(REPO, 'package.json'), size: (await stat(join(REPO, 'package.json'))).size });
  return entries;
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

async function listFiles(dir: string, prefix = ''): Promise<string[]> {
  if (!existsSync(dir)) return [];
  const out: string[] = [];
  for (const entry of (await readdir(dir, { withFileTypes: true })).sort((a, b) => (a.name < b.name ? -1 : 1))) {
    const rel = prefix ? `${prefix}/${entry.name}` : entry.name;
    if (entry.isDirectory()) out.push(...(await listFiles(join(dir, entry.name), rel)));
    else if (entry.isFile() || entry.isSymbolicLink()) out.push(rel);
  }
  return out;
}

async function fileHash(path: string): Promise<string> {
  const info = await stat(path).catch(() => undefined);
  if (!info) return `symlink:${await readlink(path)}`; // a dangling link
  return createHash('sha256').update(await readFile(path)).digest('hex');
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
  const image = await buildStarlingImage({ tag: flag('--tag'), cacheDir: flag('--cache-dir'), noCache: argv.includes('--no-cache'), log: (line) => console.error(line) });
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
