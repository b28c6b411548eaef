import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { UserError } from '../common/errors.js';

/** Kubernetes' well-known topology labels and the short keys Starling's topology rules use. */
const WELL_KNOWN: Record<string, string> = {
  'topology.kubernetes.io/zone': 'zone',
  'topology.kubernetes.io/region': 'region',
  'kubernetes.io/hostname': 'hostname',
  'failure-domain.beta.kubernetes.io/zone': 'zone',
  'failure-domain.beta.kubernetes.io/region': 'region',
};

/** Parses `key=value` label flags. */
export function parseLabelFlags(flags: string[]): Record<string, string> {
  const labels: Record<string, string> = {};
  for (const flag of flags) {
    const at = flag.indexOf('=');
    if (at <= 0) throw new UserError(`invalid label "${flag}" (expected key=value)`);
    labels[flag.slice(0, at)] = flag.slice(at + 1);
  }
  return labels;
}

/** Reads a file of Kubernetes node labels (a YAML/JSON map, or `kubectl get node -o json` output). */
export function readLabelsFile(path: string): Record<string, string> {
  let parsed: unknown;
  try {
    parsed = parseYaml(readFileSync(path, 'utf8'));
  } catch (error) {
    throw new UserError(`cannot read labels file ${path}: ${(error as Error).message}`);
  }
  const node = parsed as { metadata?: { labels?: unknown } } | null;
  const map = node && typeof node === 'object' && node.metadata?.labels ? node.metadata.labels : parsed;
  if (!map || typeof map !== 'object' || Array.isArray(map)) throw new UserError(`labels file ${path} must hold a map of labels`);
  const labels: Record<string, string> = {};
  for (const [key, value] of Object.entries(map as Record<string, unknown>)) {
    if (typeof value !== 'string') throw new UserError(`label "${key}" in ${path} is not a string`);
    labels[key] = value;
    const short = WELL_KNOWN[key];
    if (short && labels[short] === undefined) labels[short] = value;
  }
  return labels;
}
