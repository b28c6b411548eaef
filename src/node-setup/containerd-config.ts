// What `starling node-setup` changes in containerd's config.toml, worked out without touching a file:
// the registry's config_path (so hosts.toml files apply), and with lazy pulling the Starling
// snapshotter as a proxy plugin and the CRI plugin's snapshotter.

import { formatKeyPath, parseToml, setTomlValues, valueAt, type LockedPrefix, type TomlSetting } from './toml-text.js';
import { NodeSetupError } from './errors.js';
import { itemAt } from '../common/indexing.js';

export type ContainerdConfigVersion = 2 | 3;

/** The name containerd knows the Starling snapshotter by (`[proxy_plugins.starling]`). */
export const SNAPSHOTTER_NAME = 'starling';
export const DEFAULT_HOSTS_DIR = '/etc/containerd/certs.d';

/** Where the CRI plugin keeps its image settings in each config version. */
const CRI_PATHS: Record<ContainerdConfigVersion, { registry: string[]; images: string[] }> = {
  // containerd 1.6 and 1.7
  2: { registry: ['plugins', 'io.containerd.grpc.v1.cri', 'registry'], images: ['plugins', 'io.containerd.grpc.v1.cri', 'containerd'] },
  // containerd 2.x
  3: { registry: ['plugins', 'io.containerd.cri.v1.images', 'registry'], images: ['plugins', 'io.containerd.cri.v1.images'] },
};

export interface ContainerdConfigOptions {
  /** Where hosts.toml files go when the config names no config_path; must match it when it does. */
  hostsDir?: string;
  /** Add the Starling snapshotter, reached on this unix socket, and make the CRI plugin use it. */
  lazy?: { snapshotterSocket: string };
  /** The version to write into a config file that is missing or holds no settings. */
  newConfigVersion?: ContainerdConfigVersion;
  /** A leading part of the text the edit must leave alone (see k3s.ts). */
  locked?: LockedPrefix;
}

export interface ContainerdConfigPlan {
  version: ContainerdConfigVersion;
  /** The hosts.toml folder containerd reads (the first of config_path's folders). */
  hostsDir: string;
  /** The new text; equal to the old one when nothing needs changing. */
  text: string;
  /** One line per key that changes, e.g. `plugins."…".registry.config_path = "/etc/containerd/certs.d"`. */
  changes: string[];
  /** The keys that change, with their new values. */
  settings: TomlSetting[];
}

/**
 * Plans the edit of one config.toml (`text` undefined when the file does not exist). Throws
 * NodeSetupError, naming `file`, for invalid TOML, an unknown version, or settings containerd
 * would refuse in combination with config_path.
 */
export function planContainerdConfig(text: string | undefined, file: string, options: ContainerdConfigOptions): ContainerdConfigPlan {
  const source = text ?? '';
  let doc;
  try {
    doc = parseToml(source, file);
  } catch (error) {
    throw new NodeSetupError((error as Error).message);
  }
  const settings: TomlSetting[] = [];
  let version: ContainerdConfigVersion;
  if (Object.keys(doc).length === 0) {
    if (!options.newConfigVersion) {
      throw new NodeSetupError(
        `${file} ${text === undefined ? 'does not exist' : 'holds no settings'}: name the config version to write with --config-version 2 (containerd 1.6/1.7) or 3 (containerd 2.x)`,
      );
    }
    version = options.newConfigVersion;
    settings.push({ table: [], key: 'version', value: version });
  } else {
    version = configVersion(doc.version, file);
  }

  const paths = CRI_PATHS[version];
  const configPath = valueAt(doc, [...paths.registry, 'config_path']);
  let hostsDir: string;
  if (typeof configPath === 'string' && configPath !== '') {
    // config_path may list several folders (":"-separated); containerd reads the first that has the host.
    hostsDir = itemAt(configPath.split(':'), 0);
    if (options.hostsDir !== undefined && options.hostsDir !== hostsDir) {
      throw new NodeSetupError(
        `${file} already sets ${formatKeyPath([...paths.registry, 'config_path'])} = "${configPath}", which is not --hosts-dir ${options.hostsDir}: leave --hosts-dir out or name that folder`,
      );
    }
  } else {
    if (configPath !== undefined && typeof configPath !== 'string') {
      throw new NodeSetupError(`${file}: ${formatKeyPath([...paths.registry, 'config_path'])} must be a string`);
    }
    const mirrors = valueAt(doc, [...paths.registry, 'mirrors']);
    if (mirrors && typeof mirrors === 'object' && Object.keys(mirrors).length > 0) {
      throw new NodeSetupError(
        `${file} sets ${formatKeyPath([...paths.registry, 'mirrors'])}, which containerd refuses together with config_path: move those mirrors into hosts.toml files first`,
      );
    }
    hostsDir = options.hostsDir ?? DEFAULT_HOSTS_DIR;
    settings.push({ table: paths.registry, key: 'config_path', value: hostsDir });
  }

  if (options.lazy) {
    settings.push(
      { table: ['proxy_plugins', SNAPSHOTTER_NAME], key: 'type', value: 'snapshot' },
      { table: ['proxy_plugins', SNAPSHOTTER_NAME], key: 'address', value: options.lazy.snapshotterSocket },
      { table: paths.images, key: 'snapshotter', value: SNAPSHOTTER_NAME },
      // The CRI plugin passes the image reference and layer digests a remote snapshotter needs only with this off.
      { table: paths.images, key: 'disable_snapshot_annotations', value: false },
    );
  }

  const needed = settings.filter((s) => valueAt(doc, [...s.table, s.key]) !== s.value);
  if (needed.length === 0) return { version, hostsDir, text: source, changes: [], settings: [] };
  let updated: string;
  try {
    updated = setTomlValues(source, needed, file, options.locked);
  } catch (error) {
    throw new NodeSetupError((error as Error).message);
  }
  return {
    version,
    hostsDir,
    text: updated,
    changes: needed.map((s) => `${formatKeyPath([...s.table, s.key])} = ${JSON.stringify(s.value)}`),
    settings: needed,
  };
}

function configVersion(value: unknown, file: string): ContainerdConfigVersion {
  if (value === 2 || value === 3) return value;
  if (value === undefined || value === 1) {
    throw new NodeSetupError(
      `${file} is a version 1 config (${value === undefined ? 'it has no "version" key' : 'version = 1'}), the layout of containerd 1.4 and older: set version = 2 and move its settings to the version 2 names first`,
    );
  }
  throw new NodeSetupError(
    `${file}: unknown config version ${JSON.stringify(value)} (expected 2 for containerd 1.6/1.7 or 3 for containerd 2.x)`,
  );
}
