// `starling node-setup`: makes a node's container runtime pull through the local Starling peer.
// Every new file content is worked out (and every input checked) before the first byte is written,
// so bad input leaves the node as it was. containerd restarts only when its config.toml changed:
// it reads hosts.toml files on every pull.

import { execFile } from 'node:child_process';
import { stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { isRegistryHost } from '../oci/registry-hosts.js';
import { planContainerdConfig, type ContainerdConfigOptions, type ContainerdConfigVersion } from './containerd-config.js';
import { NodeSetupError } from './errors.js';
import { mergeHostsToml } from './hosts-toml.js';
import { applyWrites, readIfExists, undoWrites, type FileWrite } from './journal.js';
import { K3S_UNITS, k3sFlavour, planK3sTemplate, type TemplatePlan } from './k3s.js';
import { REGISTRIES_DROP_IN, renderRegistriesDropIn } from './registries-conf.js';

export interface NodeSetupOptions {
  /** containerd's config.toml (for k3s and RKE2, the config.toml they render: their template is edited). */
  containerdConfig?: string;
  /** hosts.toml folder when the config names none. */
  hostsDir?: string;
  /** The peer's mirror as the runtime reaches it. */
  mirror: string;
  /** Registries that get a hosts.toml; none means `_default` (every registry). */
  registries: string[];
  /** Registries containerd falls back to over plain HTTP when the mirror fails. */
  insecureRegistries: string[];
  lazy?: { snapshotterSocket: string };
  /** CRI-O / podman: write a registries.conf drop-in into this folder. */
  registriesConfDir?: string;
  /** The version for a config.toml that is missing or empty. */
  configVersion?: ContainerdConfigVersion;
  /** Where originals are kept for --undo (default: beside config.toml). */
  backupDir?: string;
  restart: boolean;
  /** argv of the restart; default: systemctl in PID 1's namespaces (see defaultRestartCommand). */
  restartCommand?: string[];
}

export interface NodeSetupReport {
  /** Human-readable lines: what changed, or that nothing did. */
  lines: string[];
  changedFiles: string[];
  restarted: boolean;
}

/** containerd's config.toml, or the template k3s and RKE2 render it from. */
const CONFIG_FILE = /\/config(-v3)?\.toml(\.tmpl)?$/;

export async function setUpNode(options: NodeSetupOptions): Promise<NodeSetupReport> {
  const mirrorUrl = mirrorOrigin(options.mirror);
  for (const registry of [...options.registries, ...options.insecureRegistries]) {
    if (!isRegistryHost(registry)) throw new NodeSetupError(`invalid registry "${registry}" (expected HOST[:PORT])`);
  }
  if (!options.containerdConfig && !options.registriesConfDir) {
    throw new NodeSetupError('nothing to set up: name --containerd-config (containerd) or --registries-conf-dir (CRI-O, podman)');
  }
  const insecure = new Set(options.insecureRegistries);
  const registries = [...new Set([...options.registries, ...options.insecureRegistries])];
  const writes: FileWrite[] = [];
  const lines: string[] = [];
  let configFile: string | undefined;
  let hostsDir: string | undefined;
  const hostsFiles = async (dir: string) => planHostsFiles(dir, registries, insecure, mirrorUrl);

  if (options.containerdConfig) {
    const { path, plan } = await planConfig(options.containerdConfig, {
      hostsDir: options.hostsDir,
      lazy: options.lazy,
      newConfigVersion: options.configVersion,
    });
    configFile = path;
    if (plan.changes.length) {
      writes.push({ path, content: plan.text });
      for (const change of plan.changes) lines.push(`${path}: set ${change}`);
    }
    hostsDir = plan.hostsDir;
    const warning = await otherFilesystemWarning(hostsDir, path);
    if (warning) lines.push(warning);
    const hosts = await hostsFiles(hostsDir);
    writes.push(...hosts.writes);
    lines.push(...hosts.lines);
  }
  if (options.registriesConfDir) {
    const file = join(options.registriesConfDir, REGISTRIES_DROP_IN);
    const content = renderRegistriesDropIn(
      mirrorUrl,
      registries.map((host) => ({ host, insecure: insecure.has(host) })),
    );
    if ((await readIfExists(file)) !== content) {
      writes.push({ path: file, content });
      lines.push(`${file}: the mirror ${mirrorUrl} for ${registries.join(', ')}`);
    }
  }

  const backupDir = options.backupDir ?? defaultBackupDir(options);
  const changedFiles = await applyWrites(backupDir, writes);
  if (changedFiles.length === 0) lines.push('nothing to change: the node already pulls through Starling');
  const configChanged = configFile !== undefined && changedFiles.includes(configFile);
  const restarted = await restartIfNeeded(configChanged, options, lines);
  if (restarted && hostsDir !== undefined && k3sFlavour(options.containerdConfig)) {
    // k3s and RKE2 empty their certs.d folder as they start and write their own hosts.toml files
    // there (from registries.yaml): the mirror goes back in front of them.
    const again = await hostsFiles(hostsDir);
    for (const file of await applyWrites(backupDir, again.writes)) {
      lines.push(`${file}: the mirror ${mirrorUrl} put first again (rewritten as ${k3sFlavour(options.containerdConfig)} restarted)`);
      if (!changedFiles.includes(file)) changedFiles.push(file);
    }
  }
  return { lines, changedFiles, restarted };
}

/** Each registry's hosts.toml (or `_default`'s) with the mirror first: the writes it takes, and what they do. */
async function planHostsFiles(
  hostsDir: string,
  registries: readonly string[],
  insecure: ReadonlySet<string>,
  mirrorUrl: string,
): Promise<{ writes: FileWrite[]; lines: string[] }> {
  const writes: FileWrite[] = [];
  const lines: string[] = [];
  for (const folder of registries.length ? registries : ['_default']) {
    const file = join(hostsDir, folder, 'hosts.toml');
    const existing = await readIfExists(file);
    const registry = folder === '_default' ? undefined : folder;
    const content = mergeHostsToml(existing, { mirrorUrl, registry, insecure: insecure.has(folder) }, file);
    if (content !== existing) {
      writes.push({ path: file, content });
      lines.push(`${file}: ${existing === undefined ? 'created with' : 'put'} the mirror ${mirrorUrl} first`);
    }
  }
  return { writes, lines };
}

export interface UndoOptions {
  containerdConfig?: string;
  registriesConfDir?: string;
  backupDir?: string;
  force: boolean;
  restart: boolean;
  restartCommand?: string[];
}

/** Restores every file node-setup changed; restarts containerd when its config was among them. */
export async function undoNodeSetup(options: UndoOptions): Promise<NodeSetupReport> {
  const backupDir = options.backupDir ?? defaultBackupDir(options);
  const restoredFiles = await undoWrites(backupDir, options.force);
  const lines = restoredFiles.map((file) => `${file}: restored`);
  if (restoredFiles.length === 0) lines.push(`nothing to undo (no backup in ${backupDir})`);
  const configChanged = restoredFiles.some((file) => CONFIG_FILE.test(file));
  const restarted = await restartIfNeeded(configChanged, options, lines);
  return { lines, changedFiles: restoredFiles, restarted };
}

function mirrorOrigin(mirror: string): string {
  let url: URL;
  try {
    url = new URL(mirror);
  } catch {
    throw new NodeSetupError(`--mirror: "${mirror}" is not a URL (expected http://127.0.0.1:65001)`);
  }
  if ((url.protocol !== 'http:' && url.protocol !== 'https:') || url.pathname !== '/' || url.search) {
    throw new NodeSetupError(`--mirror: "${mirror}" must be an http(s) URL with no path (expected http://127.0.0.1:65001)`);
  }
  return url.origin;
}

function defaultBackupDir(options: { containerdConfig?: string; registriesConfDir?: string }): string {
  const anchor = options.containerdConfig ? dirname(options.containerdConfig) : options.registriesConfDir;
  if (anchor === undefined)
    throw new NodeSetupError('--backup-dir is needed when neither --containerd-config nor --registries-conf-dir is given');
  return join(anchor, '.starling-node-setup');
}

/** The config file to edit and the edit: config.toml itself, or for k3s and RKE2 their template (k3s.ts). */
async function planConfig(configFile: string, options: ContainerdConfigOptions): Promise<TemplatePlan> {
  const flavour = k3sFlavour(configFile);
  if (flavour) return planK3sTemplate(configFile, flavour, options);
  return { path: configFile, plan: planContainerdConfig(await readIfExists(configFile), configFile, options) };
}

/**
 * A hosts folder on another filesystem than config.toml is fine on a host, but in a container it
 * usually means the folder is not mounted: hosts.toml files written there would vanish with the
 * container while containerd reads an empty folder. Said, not refused.
 */
async function otherFilesystemWarning(hostsDir: string, configFile: string): Promise<string | undefined> {
  const device = async (path: string): Promise<number> => {
    for (let p = path; ; p = dirname(p)) {
      const info = await stat(p).catch(() => undefined);
      if (info) return info.dev;
      if (p === dirname(p)) return -1;
    }
  };
  if ((await device(hostsDir)) === (await device(dirname(configFile)))) return undefined;
  return `warning: the hosts folder ${hostsDir} is not on the filesystem of ${configFile}; in a container, mount it too, or its hosts.toml files are lost`;
}

/** nsenter into PID 1's namespaces: the init container runs with hostPID, and systemd is the host's. */
const IN_HOST_NAMESPACES = ['nsenter', '--target', '1', '--mount', '--uts', '--ipc', '--net', '--pid', '--'];

/**
 * Restarts the first of its arguments (systemd units) that is active: k3s and RKE2 run their
 * containerd in the server's unit on a server node and in the agent's on an agent node, and only
 * one of them is installed. (`systemctl try-restart` of both would fail on the missing one.)
 */
const RESTART_ACTIVE_UNIT =
  'for unit in "$@"; do if systemctl is-active --quiet "$unit"; then exec systemctl restart "$unit"; fi; done; echo "none of the units $* is active" >&2; exit 1';

/** The restart run when config.toml (or its k3s/RKE2 template) changed: systemctl on the host. */
export function defaultRestartCommand(containerdConfig: string | undefined): string[] {
  const flavour = k3sFlavour(containerdConfig);
  if (!flavour) return [...IN_HOST_NAMESPACES, 'systemctl', 'restart', 'containerd'];
  return [...IN_HOST_NAMESPACES, 'sh', '-c', RESTART_ACTIVE_UNIT, 'restart-active-unit', ...K3S_UNITS[flavour]];
}

async function restartIfNeeded(
  configChanged: boolean,
  options: { containerdConfig?: string; restart: boolean; restartCommand?: string[] },
  lines: string[],
): Promise<boolean> {
  if (!configChanged) {
    if (options.containerdConfig) lines.push('containerd config unchanged: no restart needed (hosts.toml files apply to the next pull)');
    return false;
  }
  const command = options.restartCommand ?? defaultRestartCommand(options.containerdConfig);
  if (!options.restart) {
    lines.push(`containerd config changed: restart containerd to apply it (--no-restart given; would run: ${command.join(' ')})`);
    return false;
  }
  try {
    const [program, ...args] = command;
    if (program === undefined) throw new NodeSetupError('--restart-command is empty');
    await promisify(execFile)(program, args, { timeout: 120_000 });
  } catch (error) {
    const stderr = (error as { stderr?: string }).stderr?.trim();
    throw new NodeSetupError(
      `the files are written, but restarting containerd failed (${command.join(' ')}): ${stderr || (error as Error).message}`,
    );
  }
  lines.push(`restarted containerd: ${command.join(' ')}`);
  return true;
}
