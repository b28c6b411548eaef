// What `starling optimize` runs: the image config's Entrypoint, Cmd, Env, WorkingDir and User,
// overridden by the command line the way ctr-remote's optimize does it (--entrypoint and --args
// replace Entrypoint and Cmd independently; --env adds or replaces variables).
import { UserError } from '../common/errors.js';
import type { ImageConfig } from '../convert/oci-types.js';

export const DEFAULT_PATH = 'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

export interface WorkloadOverrides {
  /** JSON array of strings, replacing the image's Entrypoint. */
  entrypoint?: string;
  /** JSON array of strings, replacing the image's Cmd. */
  args?: string;
  /** KEY=VALUE entries added to (or replacing those of) the image's Env. */
  env?: string[];
  /** user[:group], names or numbers, replacing the image's User. */
  user?: string;
  /** Absolute working directory, replacing the image's WorkingDir. */
  cwd?: string;
}

export interface Workload {
  argv: string[];
  /** KEY=VALUE, in order. */
  env: string[];
  /** Absolute path inside the image. */
  cwd: string;
  /** The user as written (image config or --user), resolved with resolveUser. */
  user: string;
}

export interface ResolvedUser {
  uid: number;
  gid: number;
}

interface ContainerConfig {
  Entrypoint?: unknown;
  Cmd?: unknown;
  Env?: unknown;
  WorkingDir?: unknown;
  User?: unknown;
}

/** Parses a --entrypoint/--args value; a clear UserError for anything but a JSON array of strings. */
export function parseJsonArgv(text: string, flag: string): string[] {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new UserError(`${flag} must be a JSON array of strings, such as '["sh","-c","echo hi"]': ${(error as Error).message}`);
  }
  if (!Array.isArray(value) || !value.every((v) => typeof v === 'string')) {
    throw new UserError(`${flag} must be a JSON array of strings, such as '["sh","-c","echo hi"]'; got ${text}`);
  }
  return value;
}

function stringArray(value: unknown, what: string): string[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value) || !value.every((v) => typeof v === 'string'))
    throw new UserError(`the image config's ${what} is not an array of strings`);
  return value;
}

function checkEnvEntry(entry: string, where: string): void {
  if (!/^[^=\0]+=/.test(entry) || entry.includes('\0')) throw new UserError(`${where}: "${entry}" is not KEY=VALUE`);
}

/** The command, environment, directory and user to run, from the config and the overrides. */
export function buildWorkload(config: ImageConfig, overrides: WorkloadOverrides): Workload {
  const container = (config as { config?: ContainerConfig }).config ?? {};
  const entrypoint =
    overrides.entrypoint !== undefined
      ? parseJsonArgv(overrides.entrypoint, '--entrypoint')
      : stringArray(container.Entrypoint, 'Entrypoint');
  const args = overrides.args !== undefined ? parseJsonArgv(overrides.args, '--args') : stringArray(container.Cmd, 'Cmd');
  const argv = [...entrypoint, ...args];
  if (argv.length === 0 || argv[0] === '') {
    throw new UserError('nothing to run: the image has no Entrypoint or Cmd; give --entrypoint (and --args)');
  }

  const env = new Map<string, string>();
  for (const entry of stringArray(container.Env, 'Env')) {
    checkEnvEntry(entry, "the image config's Env");
    env.set(entry.slice(0, entry.indexOf('=')), entry);
  }
  for (const entry of overrides.env ?? []) {
    checkEnvEntry(entry, '--env');
    env.set(entry.slice(0, entry.indexOf('=')), entry);
  }
  if (!env.has('PATH')) env.set('PATH', DEFAULT_PATH); // as Docker and containerd do

  const cwd = overrides.cwd ?? (typeof container.WorkingDir === 'string' && container.WorkingDir !== '' ? container.WorkingDir : '/');
  if (!cwd.startsWith('/')) throw new UserError(`the working directory must be absolute, got "${cwd}"`);
  const user = overrides.user ?? (typeof container.User === 'string' ? container.User : '');
  return { argv, env: [...env.values()], cwd, user };
}

/**
 * Resolves `user[:group]` to numbers the way runc does: numbers are taken as they are, names
 * are looked up in the image's /etc/passwd and /etc/group; without a group, the user's primary
 * group from /etc/passwd (0 for a uid that has no entry).
 */
export async function resolveUser(spec: string, readImageFile: (path: string) => Promise<string | undefined>): Promise<ResolvedUser> {
  if (spec === '') return { uid: 0, gid: 0 };
  const [userPart = '', groupPart, ...extra] = spec.split(':'); // split gives at least one part
  if (extra.length > 0 || userPart === '' || groupPart === '') throw new UserError(`user "${spec}" must be user[:group]`);
  const numeric = (s: string) => /^\d+$/.test(s) && Number(s) < 2 ** 32;
  let passwd: string[][] | undefined;
  const passwdEntries = async () => (passwd ??= parseColonFile(await readImageFile('etc/passwd')));

  let uid: number;
  let primaryGid: number | undefined;
  if (numeric(userPart)) {
    uid = Number(userPart);
    const entry = (await passwdEntries()).find((f) => f[2] === userPart);
    primaryGid = entry && numeric(entry[3] ?? '') ? Number(entry[3]) : undefined;
  } else {
    const entry = (await passwdEntries()).find((f) => f[0] === userPart);
    if (!entry || !numeric(entry[2] ?? '') || !numeric(entry[3] ?? ''))
      throw new UserError(`user "${userPart}" is not in the image's /etc/passwd`);
    uid = Number(entry[2]);
    primaryGid = Number(entry[3]);
  }

  let gid: number;
  if (groupPart === undefined) gid = primaryGid ?? 0;
  else if (numeric(groupPart)) gid = Number(groupPart);
  else {
    const entry = parseColonFile(await readImageFile('etc/group')).find((f) => f[0] === groupPart);
    if (!entry || !numeric(entry[2] ?? '')) throw new UserError(`group "${groupPart}" is not in the image's /etc/group`);
    gid = Number(entry[2]);
  }
  return { uid, gid };
}

function parseColonFile(text: string | undefined): string[][] {
  if (!text) return [];
  return text
    .split('\n')
    .filter((line) => line.trim() !== '' && !line.startsWith('#'))
    .map((line) => line.split(':'));
}
