// The inputs of an image build, hashed into the cache key: Debian package versions, the Node
// binary, the lockfile, every file of the modules and app layers, and the builder's own sources.

import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { readdir, readFile, readlink, realpath, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { buildNativeAddons, DEBIAN_PACKAGES, REPO, type DebianPackage } from './contents.js';

const run = promisify(execFile);

export interface Inputs {
  packages: DebianPackage[];
  node: { path: string; sha256: string };
  lockfile: string;
  /** sha256 of every file that goes into the modules and app layers, by path. */
  files: string;
  builder: string;
  sourceDateEpoch: number;
  revision: string;
}

/** Reads every input (building the native addons first when some are missing). */
export async function gatherInputs(log: (line: string) => void): Promise<Inputs> {
  const packages: DebianPackage[] = [];
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
  return createHash('sha256')
    .update(await readFile(path))
    .digest('hex');
}
