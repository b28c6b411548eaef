import { createWriteStream } from 'node:fs';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { UserError } from '../common/errors.js';
import {
  buildEstargz,
  openEstargz,
  verifyEstargz,
  TOC_DIGEST_ANNOTATION,
  UNCOMPRESSED_SIZE_ANNOTATION,
  ZSTD_MANIFEST_CHECKSUM_ANNOTATION,
  ZSTD_MANIFEST_POSITION_ANNOTATION,
  type EstargzReader,
} from '../estargz/index.js';
import { MediaType } from '../oci/media-types.js';
import { verifiedBlob } from './blob-io.js';
import type { Descriptor } from './oci-types.js';
import { megabytes, type Progress } from './progress.js';
import type { ImageStore } from './store.js';

export interface LayerOptions {
  compression: 'gzip' | 'zstd';
  level?: number;
  chunkSize?: number;
  workers?: number;
  tmpDir: string;
  progress: Progress;
}

export interface LayerJob {
  source: ImageStore;
  layer: Descriptor;
  /** diff_id of the layer in the source config (kept when the layer is kept). */
  diffID: string;
  /** "layer 2/5", for messages. */
  label: string;
  prioritized?: string[];
  /** With a prioritized list meant for the whole image: collects paths not in this layer. */
  missing?: string[];
}

export interface LayerResult {
  layer: Descriptor;
  diffID: string;
  /** The converted blob on disk; absent when the source blob is kept as is. */
  file?: string;
}

const LAYER_TYPES = new Set<string>([
  MediaType.OciLayerGzip,
  MediaType.OciLayerTar,
  MediaType.OciLayerZstd,
  MediaType.DockerLayerGzip,
  'application/vnd.docker.image.rootfs.diff.tar',
]);

/**
 * Rewrites one layer as eStargz (or zstd:chunked). A layer that already is one, in the wanted
 * compression, is kept: recognized by its TOC digest annotation, or else by a footer and TOC that
 * pass full verification (it then gets the annotations). Other layers stream from the store
 * through the writer into a temp file, their digest checked on the way.
 */
export async function convertLayer(job: LayerJob, options: LayerOptions): Promise<LayerResult> {
  const { layer, label } = job;
  if (!LAYER_TYPES.has(layer.mediaType)) {
    throw new UserError(`${label} (${layer.digest}) has media type ${layer.mediaType}, which is not a tar layer Starling converts`);
  }
  const wanted = options.compression;
  const isZstdType = layer.mediaType === MediaType.OciLayerZstd;
  const prioritizedFiles = job.prioritized?.length ? job.prioritized : undefined;
  // A layer that is already eStargz is kept, unless files are to be prioritized in it: then it
  // is rebuilt (the writer drops its old TOC and landmark) so that they come first.
  if (!prioritizedFiles) {
    if (layer.annotations?.[TOC_DIGEST_ANNOTATION] && isZstdType === (wanted === 'zstd')) {
      options.progress.done(`${label} ${short(layer.digest)}: already ${formatName(wanted)}, kept`);
      return { layer: { ...layer, mediaType: targetMediaType(wanted) }, diffID: job.diffID };
    }
    const kept = await keepIfEstargz(job, wanted, options);
    if (kept) return kept;
  }

  const output = join(options.tmpDir, `layer-${layer.digest.slice(7)}-${wanted}`);
  try {
    const input = Readable.from(
      verifiedBlob(job.source, layer, (n) =>
        options.progress.update(`${label} ${short(layer.digest)}: converting ${megabytes(n)} / ${megabytes(layer.size)}`),
      ),
    );
    const result = await buildEstargz(input, createWriteStream(output), {
      compression: wanted,
      level: options.level,
      chunkSize: options.chunkSize,
      workers: options.workers,
      prioritizedFiles,
      missingPrioritized: prioritizedFiles ? job.missing : undefined,
      // Always spool, like Go's Build: a tar naming a path twice keeps the last one.
      spool: true,
      tmpDir: options.tmpDir,
    });
    const annotations: Record<string, string> = {
      ...layer.annotations,
      [TOC_DIGEST_ANNOTATION]: result.tocDigest,
      [UNCOMPRESSED_SIZE_ANNOTATION]: String(result.uncompressedSize),
    };
    if (result.zstdManifest) {
      annotations[ZSTD_MANIFEST_CHECKSUM_ANNOTATION] = result.zstdManifest.checksum;
      annotations[ZSTD_MANIFEST_POSITION_ANNOTATION] = result.zstdManifest.position;
    }
    options.progress.done(`${label} ${short(layer.digest)} -> ${short(result.digest)} (${formatName(wanted)}, ${megabytes(result.size)})`);
    return {
      layer: { mediaType: targetMediaType(wanted), digest: result.digest, size: result.size, annotations },
      diffID: result.diffID,
      file: output,
    };
  } catch (error) {
    throw new UserError(`${label} (${layer.digest}) of ${job.source.name}: ${(error as Error).message}`, { cause: error });
  }
}

/** Keeps a layer whose footer and TOC say it is already eStargz/zstd:chunked, after verifying it all. */
async function keepIfEstargz(job: LayerJob, wanted: 'gzip' | 'zstd', options: LayerOptions): Promise<LayerResult | undefined> {
  const source = await job.source.blobSource(job.layer.digest);
  try {
    let reader: EstargzReader;
    try {
      reader = await openEstargz(source);
    } catch {
      return undefined; // no footer or TOC: an ordinary layer
    }
    if (reader.format !== wanted) return undefined;
    options.progress.update(`${job.label} ${short(job.layer.digest)}: verifying existing ${formatName(wanted)}`);
    const verified = await verifyEstargz(source, { tocDigest: reader.tocDigest }).catch((error: Error) => {
      throw new UserError(`${job.label} (${job.layer.digest}) looks like ${formatName(wanted)} but fails verification: ${error.message}`);
    });
    if (verified.diffID !== job.diffID) {
      throw new UserError(
        `${job.label} (${job.layer.digest}): its content has diff ID ${verified.diffID} but the config says ${job.diffID}`,
      );
    }
    options.progress.done(`${job.label} ${short(job.layer.digest)}: already ${formatName(wanted)}, kept`);
    const annotations = {
      ...job.layer.annotations,
      [TOC_DIGEST_ANNOTATION]: reader.tocDigest,
      [UNCOMPRESSED_SIZE_ANNOTATION]: String(verified.uncompressedSize),
    };
    return { layer: { ...job.layer, mediaType: targetMediaType(wanted), annotations }, diffID: job.diffID };
  } finally {
    await source.close?.();
  }
}

function targetMediaType(compression: 'gzip' | 'zstd'): string {
  return compression === 'zstd' ? MediaType.OciLayerZstd : MediaType.OciLayerGzip;
}

function formatName(compression: 'gzip' | 'zstd'): string {
  return compression === 'zstd' ? 'zstd:chunked' : 'eStargz';
}

export function short(digest: string): string {
  return digest.slice(0, 19);
}
