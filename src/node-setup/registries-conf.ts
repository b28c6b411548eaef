// CRI-O and podman read mirrors from containers-registries.conf(5); a drop-in file under
// registries.conf.d adds the Starling mirror for one registry without touching the main file.

import { isRegistryHost } from '../oci/registry-hosts.js';
import { NodeSetupError } from './errors.js';
import { itemAt } from '../common/indexing.js';

export const REGISTRIES_DROP_IN = '50-starling.conf';

/**
 * The drop-in for `registry`. CRI-O and podman do not tell a mirror which registry a request is
 * for, so the peer sends them all to its `--registry-default`: one registry per node.
 */
export function renderRegistriesDropIn(mirrorUrl: string, registries: readonly string[]): string {
  if (registries.length !== 1) {
    throw new NodeSetupError(
      `--registries-conf-dir needs exactly one --registry (got ${registries.length}): CRI-O and podman do not tell a mirror which registry they want, so the peer serves them its --registry-default only`,
    );
  }
  const registry = itemAt(registries, 0);
  if (!isRegistryHost(registry)) throw new NodeSetupError(`invalid registry "${registry}" (expected HOST[:PORT])`);
  const mirror = new URL(mirrorUrl);
  return [
    '# Written by `starling node-setup`: pulls go through the local Starling peer (`starling node-setup --undo` removes this file).',
    '[[registry]]',
    `prefix = "${registry}"`,
    `location = "${registry}"`,
    '',
    '[[registry.mirror]]',
    `location = "${mirror.host}"`,
    `insecure = ${mirror.protocol === 'http:'}`,
    '',
  ].join('\n');
}
