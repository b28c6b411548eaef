// The project's N-API addons: native/<name>, built by `npm ci` when the machine can build them
// (scripts/build-addons.mjs, package.json's install script). Each is loaded once; a missing one is
// remembered as missing.
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { errorMessage, UserError } from './errors.js';

const load = createRequire(import.meta.url);
const addons = new Map<string, { addon: unknown } | { error: unknown }>();

/** Where native/<name>'s built addon `<file>.node` lives. */
export function addonPath(name: string, file: string): string {
  return fileURLToPath(new URL(`../../native/${name}/build/Release/${file}.node`, import.meta.url));
}

function loadOnce(name: string, file: string): { addon: unknown } | { error: unknown } {
  const path = addonPath(name, file);
  let entry = addons.get(path);
  if (!entry) {
    try {
      entry = { addon: load(path) };
    } catch (error) {
      entry = { error };
    }
    addons.set(path, entry);
  }
  return entry;
}

/** The addon, or null when it is not built (for callers that have a slower way without it). */
export function optionalAddon<T>(name: string, file: string): T | null {
  const entry = loadOnce(name, file);
  return 'addon' in entry ? (entry.addon as T) : null;
}

/**
 * The addon, or an error for the person running the command: whether the addon was never built
 * or was built and cannot be loaded here (a shared library missing), and `howToGet` it.
 */
export function requiredAddon<T>(name: string, file: string, howToGet: string): T {
  const entry = loadOnce(name, file);
  if ('addon' in entry) return entry.addon as T;
  const path = addonPath(name, file);
  const problem = existsSync(path) ? `cannot be loaded (${errorMessage(entry.error)})` : `is not built (no ${path})`;
  throw new UserError(`the ${name} addon (native/${name}) ${problem}; ${howToGet}`, { cause: entry.error });
}
