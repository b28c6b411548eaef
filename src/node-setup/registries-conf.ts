// CRI-O and podman read mirrors from containers-registries.conf(5); a drop-in file under
// registries.conf.d adds the Starling mirror for each registry without touching the main file.
// They tell a mirror nothing about the registry a request is for, so each registry's mirror
// location names it in the path (`127.0.0.1:65001/starling-registry/reg.example__5000`), where
// the peer reads it back (peer/mirror/upstream.ts).

import { registryNamespace } from '../peer/mirror/upstream.js';
import { NodeSetupError } from './errors.js';

export const REGISTRIES_DROP_IN = '50-starling.conf';

export interface DropInRegistry {
  host: string;
  /** Reached over plain HTTP when the runtime falls back to the registry itself. */
  insecure: boolean;
}

/**
 * The drop-in: one `[[registry]]` per registry, the mirror first. It replaces any entry of the
 * main file with the same prefix (the runtime keeps the last), so `insecure` is repeated here.
 */
export function renderRegistriesDropIn(mirrorUrl: string, registries: readonly DropInRegistry[]): string {
  if (registries.length === 0) {
    throw new NodeSetupError(
      '--registries-conf-dir needs at least one --registry (or --insecure-registry): registries.conf has no entry that matches every registry',
    );
  }
  const mirror = new URL(mirrorUrl);
  const lines = [
    '# Written by `starling node-setup`: pulls go through the local Starling peer (`starling node-setup --undo` removes this file).',
  ];
  for (const { host, insecure } of registries) {
    let namespace: string;
    try {
      namespace = registryNamespace(host);
    } catch (error) {
      throw new NodeSetupError(`--registries-conf-dir: ${(error as Error).message}`);
    }
    lines.push('', '[[registry]]', `prefix = "${host}"`, `location = "${host}"`);
    if (insecure) lines.push('insecure = true');
    lines.push('', '[[registry.mirror]]', `location = "${mirror.host}/${namespace}"`, `insecure = ${mirror.protocol === 'http:'}`);
  }
  return lines.join('\n') + '\n';
}
