// The snapshot labels that mark a layer as remote. containerd's unpacker passes the layer
// descriptor's `containerd.io/snapshot/` annotations plus `containerd.io/snapshot.ref` (the
// chain id to commit under). `ctr-remote images rpull` adds stargz-snapshotter's source labels
// (fs/source/source.go); the CRI plugin adds its own `cri.*` pair.
import { parseImageReference, type ImageReference } from '../oci/reference.js';

export const TARGET_SNAPSHOT_LABEL = 'containerd.io/snapshot.ref';
export const STARGZ_REFERENCE_LABEL = 'containerd.io/snapshot/remote/stargz.reference';
export const STARGZ_DIGEST_LABEL = 'containerd.io/snapshot/remote/stargz.digest';
export const STARGZ_PREFETCH_LABEL = 'containerd.io/snapshot/remote/stargz.prefetch';
export const CRI_IMAGE_REF_LABEL = 'containerd.io/snapshot/cri.image-ref';
export const CRI_LAYER_DIGEST_LABEL = 'containerd.io/snapshot/cri.layer-digest';
export const TOC_DIGEST_LABEL = 'containerd.io/snapshot/stargz/toc.digest';
/** This layer's digest and the image's layers after it, comma-separated (ctr-remote; the CRI plugin's own name below). */
export const STARGZ_LAYERS_LABEL = 'containerd.io/snapshot/remote/stargz.layers';
export const CRI_IMAGE_LAYERS_LABEL = 'containerd.io/snapshot/cri.image-layers';
/** Set by us on committed remote snapshots (stargz-snapshotter's own marker). */
export const REMOTE_LABEL = 'containerd.io/snapshot/remote';
export const REMOTE_LABEL_VALUE = 'remote snapshot';

/** Where a remote layer's blob lives, and how to trust its TOC. */
export interface RemoteLayerSpec {
  /** The snapshot name to commit under (the layer's chain id). */
  target: string;
  image: ImageReference;
  /** The layer blob's digest. */
  digest: string;
  tocDigest: string;
  /** Prefetch size asked for by the puller, when it asked (bytes). */
  prefetchSize?: number;
  /** Digests of the image's later layers, which containerd will prepare next (resolved ahead, as stargz-snapshotter does). */
  nextLayers: string[];
}

const DIGEST = /^sha256:[0-9a-f]{64}$/;

/**
 * The remote layer the labels describe, or why they describe none (then the layer is an
 * ordinary snapshot that containerd downloads and unpacks).
 */
export function remoteLayerFromLabels(labels: Record<string, string>): RemoteLayerSpec | string {
  const target = labels[TARGET_SNAPSHOT_LABEL];
  if (!target) return `no ${TARGET_SNAPSHOT_LABEL} label`;
  const ref = labels[STARGZ_REFERENCE_LABEL] ?? labels[CRI_IMAGE_REF_LABEL];
  const digest = labels[STARGZ_DIGEST_LABEL] ?? labels[CRI_LAYER_DIGEST_LABEL];
  const tocDigest = labels[TOC_DIGEST_LABEL];
  if (!ref || !digest) return 'no image reference or layer digest label';
  // Without a TOC digest nothing vouches for the TOC: such a layer is downloaded whole.
  if (!tocDigest) return `no ${TOC_DIGEST_LABEL} label (not an eStargz layer)`;
  if (!DIGEST.test(digest)) return `layer digest "${digest}" is not a sha256 digest`;
  if (!DIGEST.test(tocDigest)) return `TOC digest "${tocDigest}" is not a sha256 digest`;
  let image: ImageReference;
  try {
    image = parseImageReference(ref);
  } catch (error) {
    return (error as Error).message;
  }
  const prefetch = Number(labels[STARGZ_PREFETCH_LABEL]);
  // A hint only: digests that do not parse are left out.
  const nextLayers = (labels[STARGZ_LAYERS_LABEL] ?? labels[CRI_IMAGE_LAYERS_LABEL] ?? '')
    .split(',')
    .map((d) => d.trim())
    .filter((d) => DIGEST.test(d) && d !== digest);
  return {
    target,
    image,
    digest,
    tocDigest,
    prefetchSize: Number.isSafeInteger(prefetch) && prefetch >= 0 && labels[STARGZ_PREFETCH_LABEL] ? prefetch : undefined,
    nextLayers: [...new Set(nextLayers)],
  };
}
