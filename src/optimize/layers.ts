// The image's layers mounted lazily (one FUSE mount per eStargz layer, read from the local
// unoptimized conversion), with an access hook per layer; and small reads of the merged image
// straight from the TOCs, for what must be known before the workload runs (/etc/passwd).
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { fileSource, TOC_DIGEST_ANNOTATION, type EstargzReader, type RangeSource } from '../estargz/index.js';
import { mountLazyLayer, type LazyLayer } from '../lazy/index.js';
import type { Descriptor } from '../convert/oci-types.js';

export interface MountedLayers {
  /** Mountpoints, bottom layer first (manifest order). */
  dirs: string[];
  layers: LazyLayer[];
  readers: EstargzReader[];
  /** Unmounts everything still mounted; never throws (problems go to onWarning). */
  unmountAll(): Promise<void>;
}

export interface MountLayersOptions {
  /** Each layer's blob as a local file. */
  blobPath: (digest: string) => string;
  /** Under which l<i> mountpoints and the chunk cache are made. */
  dir: string;
  onAccess: (layerIndex: number) => (path: string) => void;
  onWarning: (message: string) => void;
}

export async function mountLayers(descriptors: Descriptor[], options: MountLayersOptions): Promise<MountedLayers> {
  const layers: LazyLayer[] = [];
  const sources: RangeSource[] = [];
  const dirs: string[] = [];
  const unmountAll = async () => {
    for (const layer of layers.splice(0).reverse()) {
      try {
        await layer.unmount();
      } catch (error) {
        options.onWarning(`unmount ${layer.mountpoint}: ${(error as Error).message}; detaching it`);
        await layer.unmount({ lazy: true }).catch((e: Error) => options.onWarning(`unmount -l ${layer.mountpoint}: ${e.message}`));
      }
    }
    for (const source of sources.splice(0)) await source.close?.().catch(() => {});
  };
  try {
    for (const [i, descriptor] of descriptors.entries()) {
      const tocDigest = descriptor.annotations?.[TOC_DIGEST_ANNOTATION];
      if (!tocDigest) throw new Error(`layer ${i} (${descriptor.digest}) of the converted image has no TOC digest`);
      const mountpoint = path.join(options.dir, `l${i}`);
      await mkdir(mountpoint, { recursive: true });
      const source = await fileSource(options.blobPath(descriptor.digest));
      sources.push(source);
      const layer = await mountLazyLayer({
        source,
        tocDigest,
        mountpoint,
        cacheDir: path.join(options.dir, 'cache'),
        prefetch: false,
        backgroundFetch: { enabled: false },
        onAccess: options.onAccess(i),
        onWarning: (message) => options.onWarning(`layer ${i}: ${message}`),
      });
      layers.push(layer);
      dirs.push(mountpoint);
    }
  } catch (error) {
    await unmountAll();
    throw error;
  }
  return { dirs, layers, readers: layers.map((l) => l.reader), unmountAll };
}

const WHITEOUT = '.wh.';
const OPAQUE = '.wh..wh..opq';

/**
 * A regular file of the merged image (layers bottom first), read from the TOCs without going
 * through the mounts (so it is not recorded). Follows overlay rules for whiteouts and opaque
 * directories; a symlink anywhere on the way gives undefined (this is for /etc/passwd and the like).
 */
export async function readMergedFile(readers: readonly EstargzReader[], name: string): Promise<Buffer | undefined> {
  const parts = name.split('/').filter(Boolean);
  for (const reader of [...readers].reverse()) {
    const entry = reader.lookup(parts.join('/'));
    if (entry) {
      let target = entry;
      while (target.type === 'hardlink') {
        const next = reader.lookup(target.linkName);
        if (!next) return undefined;
        target = next;
      }
      return target.type === 'reg' ? reader.readFile(target.name) : undefined;
    }
    // Hidden below this layer: a whiteout of the file or of a parent, or an opaque parent.
    for (let depth = 0; depth < parts.length; depth++) {
      const parent = parts.slice(0, depth).join('/');
      const prefix = parent ? `${parent}/` : '';
      if (reader.lookup(`${prefix}${WHITEOUT}${parts[depth]}`)) return undefined;
      if (depth < parts.length - 1 && reader.lookup(`${prefix}${parts[depth]}/${OPAQUE}`)) return undefined;
    }
  }
  return undefined;
}
