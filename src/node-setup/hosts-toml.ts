// One registry's hosts.toml with the Starling mirror first: containerd tries hosts in the order the
// file lists them, so the mirror goes before every table the node already had, and those stay
// after it unchanged (their CA files, client certificates and headers included).

import { registryServerUrl, renderMirrorHost } from '../peer/containerd-hosts.js';
import { NodeSetupError } from './errors.js';
import { firstTableOffset, parseToml, valueAt } from './toml-text.js';

const BEGIN = '# BEGIN starling node-setup: pulls go through the local Starling peer (`starling node-setup --undo` removes this)';
const END = '# END starling node-setup';

export interface MirrorEntry {
  /** The mirror's origin as containerd reaches it, e.g. http://127.0.0.1:65001. */
  mirrorUrl: string;
  /** The registry the file is for; undefined for `_default`. */
  registry: string | undefined;
  /** Whether containerd's fallback to the registry itself uses plain HTTP (only for a new file). */
  insecure: boolean;
}

/**
 * The hosts.toml text with the mirror entry first. `existing` is the file's current text, or
 * undefined when there is none (then the file names the registry as its `server`). Running it on
 * its own output changes nothing.
 */
export function mergeHostsToml(existing: string | undefined, entry: MirrorEntry, file: string): string {
  const block = [BEGIN, ...renderMirrorHost(entry.mirrorUrl, entry.registry), END].join('\n') + '\n';
  if (existing === undefined) {
    const server = entry.registry ? `server = "${registryServerUrl(entry.registry, entry.insecure)}"\n\n` : '';
    return server + block;
  }
  let doc;
  try {
    doc = parseToml(existing, file);
  } catch (error) {
    throw new NodeSetupError((error as Error).message);
  }
  let merged: string;
  const begin = existing.indexOf(BEGIN);
  if (begin >= 0) {
    const end = existing.indexOf(END, begin);
    if (end < 0)
      throw new NodeSetupError(
        `${file}: the Starling block has a "${BEGIN.slice(0, 30)}…" line but no "${END}" line; restore the file by hand`,
      );
    const after = existing.indexOf('\n', end);
    merged = existing.slice(0, begin) + block + (after < 0 ? '' : existing.slice(after + 1));
  } else {
    if (valueAt(doc, ['host', entry.mirrorUrl]) !== undefined) {
      throw new NodeSetupError(`${file} already has a [host."${entry.mirrorUrl}"] table of its own: remove it, then run node-setup again`);
    }
    const at = firstTableOffset(existing);
    const before = existing.slice(0, at);
    const separator = before === '' || before.endsWith('\n\n') ? '' : before.endsWith('\n') ? '\n' : '\n\n';
    merged = before + separator + block + (at < existing.length ? '\n' + existing.slice(at) : '');
  }
  checkMirrorFirst(merged, entry.mirrorUrl, file);
  return merged;
}

/** The merged file must parse and list the mirror before every other host. */
function checkMirrorFirst(text: string, mirrorUrl: string, file: string): void {
  let hosts: unknown;
  try {
    hosts = valueAt(parseToml(text, file), ['host']);
  } catch {
    throw new NodeSetupError(`${file}: adding the mirror would make the file invalid; add it by hand`);
  }
  const first = hosts && typeof hosts === 'object' ? Object.keys(hosts)[0] : undefined;
  if (first !== mirrorUrl)
    throw new NodeSetupError(`${file}: cannot place the mirror before the host "${first}" (it is set with dotted keys); add it by hand`);
}
