// Shared plumbing for the lazy-layer tests: a real registry and a real Starling peer, layers
// mounted through the peer's mirror, and mount bookkeeping that always unmounts.
import fs from 'node:fs';
import path from 'node:path';
import { blobBytesSent, startRegistry, type Registry } from '../fixtures/registry.js';
import { startPeer, type RunningPeerProcess } from '../fixtures/peer.js';
import { uploadBlobFile } from '../fixtures/images.js';
import { makeTempDir, run, type TempDir } from '../fixtures/processes.js';
import { HttpRangeSource, mirrorBlobUrl, mountLazyLayer, type LazyLayer, type LazyLayerOptions } from '../../src/lazy/index.js';
import type { EstargzReader, EstargzEntry } from '../../src/estargz/index.js';

export const REPO = 'lazy/layer';

export interface Env {
  tmp: TempDir;
  registry: Registry;
  peer: RunningPeerProcess;
  /** Mounts still to be unmounted by cleanup(). */
  mounts: Set<LazyLayer>;
  sources: Set<HttpRangeSource>;
}

export async function startEnv(): Promise<Env> {
  const tmp = await makeTempDir('starling-lazy-');
  const registry = await startRegistry();
  const peer = await startPeer({ insecure: [registry.host] });
  return { tmp, registry, peer, mounts: new Set(), sources: new Set() };
}

export async function stopEnv(env: Env | undefined): Promise<void> {
  if (!env) return;
  for (const layer of env.mounts) await layer.unmount({ lazy: true }).catch(() => {});
  for (const source of env.sources) await source.close().catch(() => {});
  await env.peer.stop();
  await env.registry.stop();
  await env.tmp.remove();
}

export async function pushBlob(env: Env, file: string, digest: string, size: number): Promise<void> {
  await uploadBlobFile(env.registry, REPO, file, digest, size);
}

/** The blob through the peer mirror, as the snapshotter will read it. */
export async function peerSource(env: Env, digest: string): Promise<HttpRangeSource> {
  const source = await HttpRangeSource.open(mirrorBlobUrl(env.peer.url, REPO, digest, env.registry.host));
  env.sources.add(source);
  return source;
}

let mountCounter = 0;

export async function mountFromPeer(
  env: Env,
  digest: string,
  tocDigest: string,
  options: Partial<LazyLayerOptions> & { cacheDir?: string } = {},
): Promise<{ layer: LazyLayer; source: HttpRangeSource; mountpoint: string; cacheDir: string; warnings: string[] }> {
  const n = ++mountCounter;
  const mountpoint = path.join(env.tmp.path, `mnt-${n}`);
  const cacheDir = options.cacheDir ?? path.join(env.tmp.path, `cache-${n}`);
  fs.mkdirSync(mountpoint);
  const source = await peerSource(env, digest);
  const warnings: string[] = [];
  const layer = await mountLazyLayer({
    source,
    tocDigest,
    mountpoint,
    cacheDir,
    prefetch: true,
    backgroundFetch: { enabled: false },
    onWarning: (message) => warnings.push(message),
    ...options,
  });
  env.mounts.add(layer);
  return { layer, source, mountpoint, cacheDir, warnings };
}

export async function unmount(env: Env, layer: LazyLayer): Promise<void> {
  await layer.unmount();
  env.mounts.delete(layer);
}

export function registryBytes(env: Env, digest: string): number {
  return blobBytesSent(env.registry.requests(), digest);
}

/** Runs a command in its own process (never touch our own mount from this thread synchronously). */
export async function sh(cmd: string, args: string[], cwd?: string) {
  return run(cmd, args, { cwd, timeoutMs: 60_000 });
}

export function isMounted(mountpoint: string): boolean {
  return fs
    .readFileSync('/proc/mounts', 'utf8')
    .split('\n')
    .some((line) => line.split(' ')[1] === mountpoint);
}

/** TOC entries as the mount shows them: whiteouts and root landmarks hidden. */
export function visibleEntries(reader: EstargzReader): EstargzEntry[] {
  return reader.entries.filter((e) => {
    const base = e.name.slice(e.name.lastIndexOf('/') + 1);
    if (e.name === '') return false;
    if (base.startsWith('.wh.')) return false;
    return e.name !== '.prefetch.landmark' && e.name !== '.no.prefetch.landmark';
  });
}

export function resolveHardlink(reader: EstargzReader, entry: EstargzEntry): EstargzEntry {
  let current = entry;
  while (current.type === 'hardlink') {
    const target = reader.lookup(current.linkName);
    if (!target) throw new Error(`${current.name} links to ${current.linkName}, which the TOC lacks`);
    current = target;
  }
  return current;
}
