import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { isRegistryHost } from '../oci/registry-hosts.js';
import { REGISTRY_HEADER } from './mirror/upstream.js';

export interface HostsTomlOptions {
  /** containerd's `config_path` / `ctr --hosts-dir` folder. */
  hostsDir: string;
  /** The mirror as containerd reaches it, e.g. http://127.0.0.1:65001. */
  mirrorUrl: string;
  /** Registries that get their own hosts.toml (the server line names them). */
  registries: string[];
  /** Registries reached over plain HTTP when containerd falls back to them. */
  insecure: string[];
  /** Also write `_default/hosts.toml`, so every other registry goes through the mirror too. */
  includeDefault: boolean;
}

/** Renders one hosts.toml: the mirror first, the registry itself as containerd's fallback. */
export function renderHostsToml(mirrorUrl: string, registry: string | undefined, insecure: boolean): string {
  const lines: string[] = ['# Written by `starling containerd-config`: pulls go through the local Starling peer.'];
  if (registry) lines.push(`server = "${registryServerUrl(registry, insecure)}"`);
  lines.push('', ...renderMirrorHost(mirrorUrl, registry));
  return `${lines.join('\n')}\n`;
}

/** The registry's own URL, where containerd goes when the mirror fails (docker.io's API lives elsewhere). */
export function registryServerUrl(registry: string, insecure: boolean): string {
  return registry === 'docker.io' ? 'https://registry-1.docker.io' : `${insecure ? 'http' : 'https'}://${registry}`;
}

/**
 * The hosts.toml lines of the mirror's `[host."…"]` table. The header names the registry for
 * clients that do not send `?ns=` (containerd does, for registries other than `_default`).
 */
export function renderMirrorHost(mirrorUrl: string, registry: string | undefined): string[] {
  const lines = [`[host."${mirrorUrl}"]`, '  capabilities = ["pull", "resolve"]'];
  if (registry) lines.push(`  [host."${mirrorUrl}".header]`, `    ${REGISTRY_HEADER} = "${registry}"`);
  return lines;
}

export async function writeHostsToml(options: HostsTomlOptions): Promise<string[]> {
  const url = new URL(options.mirrorUrl);
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new Error(`mirror URL must be http(s): ${options.mirrorUrl}`);
  const mirror = url.origin;
  const written: string[] = [];
  const insecure = new Set(options.insecure);
  for (const registry of options.registries) {
    if (!isRegistryHost(registry)) throw new Error(`invalid registry "${registry}" (expected HOST[:PORT])`);
    written.push(await writeOne(options.hostsDir, registry, renderHostsToml(mirror, registry, insecure.has(registry))));
  }
  if (options.includeDefault) written.push(await writeOne(options.hostsDir, '_default', renderHostsToml(mirror, undefined, false)));
  return written;
}

async function writeOne(hostsDir: string, folder: string, text: string): Promise<string> {
  const dir = join(hostsDir, folder);
  await mkdir(dir, { recursive: true });
  const file = join(dir, 'hosts.toml');
  await writeFile(file, text);
  return file;
}
