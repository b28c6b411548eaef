// What goes into each layer of Starling's image: Debian's runtime libraries, FUSE and busybox; the
// machine's Node binary; production node_modules with the native addons; the built application.

import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { cp, mkdir, readdir, realpath, stat, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { addTree, type LayerEntry } from './layer-tar.js';

const run = promisify(execFile);
export const REPO = resolve(fileURLToPath(new URL('../..', import.meta.url)));

/** Debian packages in the base layer: what node, the native addons and node-setup's restart need at run time. */
export const DEBIAN_PACKAGES = ['libc6', 'libgcc-s1', 'libstdc++6', 'libfuse3-3', 'busybox-static'];
/** busybox applets linked in /bin: a shell for debugging, nsenter for node-setup's restart, mount tools for the snapshotter. */
const BUSYBOX_APPLETS = ['sh', 'nsenter', 'mount', 'umount', 'ls', 'cat', 'ps', 'kill', 'sleep', 'env', 'id'];
/** The non-root user the manager and the scheduler run as (the peer and snapshotter need root). */
export const IMAGE_USER = { uid: 65532, gid: 65532, name: 'starling' };
export const APP_DIR = '/opt/starling';
export const NATIVE_ADDONS = ['digest', 'fuse', 'sendfile'];
/**
 * Every file's time in every layer: fixed rather than the commit's, so a layer whose files did not
 * change keeps its digest across commits and a node upgrading Starling fetches only what changed
 * (usually the 0.3 MiB app layer). The config's `created` is the commit's time.
 */
export const LAYER_MTIME = new Date('2020-01-01T00:00:00Z');

export interface DebianPackage {
  name: string;
  version: string;
}

/** The project's own addons are optional at install time: the image needs every one built. */
export async function buildNativeAddons(log: (line: string) => void): Promise<void> {
  for (const name of NATIVE_ADDONS) {
    const release = join(REPO, 'native', name, 'build', 'Release');
    const built = existsSync(release) && (await readdir(release)).some((f) => f.endsWith('.node'));
    if (built) continue;
    log(`building native/${name}`);
    await run('npm', ['run', `build:${name}`], { cwd: REPO, maxBuffer: 64 << 20 });
  }
}

/** Debian's runtime libraries, libfuse3 and busybox, from their .deb files (kept under the cache). */
export async function baseEntries(
  cacheDir: string,
  staging: string,
  packages: DebianPackage[],
  log: (line: string) => void,
): Promise<Map<string, LayerEntry>> {
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
  await writeFile(
    join(etc, 'passwd'),
    `root:x:0:0:root:/root:/bin/sh\n${user.name}:x:${user.uid}:${user.gid}:${user.name}:/var/lib/starling:/bin/false\n`,
  );
  await writeFile(join(etc, 'group'), `root:x:0:\n${user.name}:x:${user.gid}:\n`);
  for (const name of ['passwd', 'group']) {
    entries.set(`/etc/${name}`, {
      type: 'file',
      path: `/etc/${name}`,
      mode: 0o644,
      source: join(etc, name),
      size: (await stat(join(etc, name))).size,
    });
  }
  entries.set('/tmp', { type: 'dir', path: '/tmp', mode: 0o1777 });
  entries.set('/root', { type: 'dir', path: '/root', mode: 0o700 });
  // The default data folder, writable by the non-root user when no volume is mounted there.
  entries.set('/var/lib/starling', { type: 'dir', path: '/var/lib/starling', mode: 0o755, uid: user.uid, gid: user.gid });
  return entries;
}

/** The machine's Node 20 binary (a single file on this machine kind), without its debug symbols. */
export async function nodeEntries(staging: string): Promise<Map<string, LayerEntry>> {
  const binary = join(staging, 'node');
  // strip (binutils, which node-gyp's toolchain brings) takes 99 MB to 86 MB: 31 MB gzip'd.
  await run('strip', ['-o', binary, await realpath(process.execPath)]);
  const entries = new Map<string, LayerEntry>();
  entries.set('/usr/local/bin/node', {
    type: 'file',
    path: '/usr/local/bin/node',
    mode: 0o755,
    source: binary,
    size: (await stat(binary)).size,
  });
  return entries;
}

/** Production node_modules (npm prune --omit=dev of the built tree) and the project's native addons. */
export async function moduleEntries(staging: string, log: (line: string) => void): Promise<Map<string, LayerEntry>> {
  const dir = join(staging, 'modules');
  await mkdir(dir);
  for (const file of ['package.json', 'package-lock.json']) await cp(join(REPO, file), join(dir, file));
  await cp(join(REPO, 'node_modules'), join(dir, 'node_modules'), { recursive: true, verbatimSymlinks: true });
  log('npm prune --omit=dev');
  await run('npm', ['prune', '--omit=dev', '--ignore-scripts', '--no-audit', '--no-fund'], { cwd: dir, maxBuffer: 64 << 20 });
  const entries = new Map<string, LayerEntry>();
  await addTree(entries, join(dir, 'node_modules'), `${APP_DIR}/node_modules`, keepModuleFile);
  for (const name of NATIVE_ADDONS) {
    await addTree(
      entries,
      join(REPO, 'native', name, 'build', 'Release'),
      `${APP_DIR}/native/${name}/build/Release`,
      (rel, isDir) => !isDir && rel.endsWith('.node'),
    );
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
export async function appEntries(): Promise<Map<string, LayerEntry>> {
  const entries = new Map<string, LayerEntry>();
  await addTree(entries, join(REPO, 'dist'), `${APP_DIR}/dist`, (rel) => !rel.endsWith('.map'));
  await addTree(entries, join(REPO, 'console', 'dist'), `${APP_DIR}/console/dist`);
  await addTree(entries, join(REPO, 'proto'), `${APP_DIR}/proto`);
  entries.set(`${APP_DIR}/package.json`, {
    type: 'file',
    path: `${APP_DIR}/package.json`,
    mode: 0o644,
    source: join(REPO, 'package.json'),
    size: (await stat(join(REPO, 'package.json'))).size,
  });
  return entries;
}
