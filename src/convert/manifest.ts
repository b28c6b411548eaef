import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { UserError } from '../common/errors.js';
import { itemAt } from '../common/indexing.js';
import type { Manifest } from '../oci/client.js';
import { digestOf } from '../oci/digest.js';
import { MediaType } from '../oci/media-types.js';
import { downloadBlob, readSmallBlob } from './blob-io.js';
import { convertLayer, short, type LayerOptions, type LayerResult } from './layer.js';
import type { Descriptor, ImageConfig, ImageManifest } from './oci-types.js';
import { formatPlatform, platformMatches, type Platform } from './platform.js';
import type { ImageStore } from './store.js';

export interface ManifestOptions extends LayerOptions {
  /** Paths to prioritize in every layer that holds them. */
  prioritizedFiles?: string[];
  /** Recorded paths per layer index for this manifest (ctr-remote --record-out). */
  recorded?: Map<number, string[]>;
  /** Refuse an image whose config names another platform. */
  expectPlatform?: Platform;
}

export interface ConvertedManifest {
  bytes: Buffer;
  mediaType: string;
  digest: string;
  /** Prioritized paths found in no layer. */
  missing: string[];
}

const IMAGE_MANIFEST_TYPES = new Set<string>([MediaType.OciManifest, MediaType.DockerManifest]);

export function isImageManifest(mediaType: string): boolean {
  return IMAGE_MANIFEST_TYPES.has(mediaType);
}

/**
 * Converts one image: every layer, then the config (rootfs.diff_ids rewritten) and an OCI
 * manifest carrying the layer annotations. Blobs are pushed to `dst` as they are ready; the
 * manifest is returned, not pushed, so the caller decides what gets the tag.
 */
export async function convertManifest(
  src: ImageStore,
  dst: ImageStore,
  manifest: Manifest,
  options: ManifestOptions,
): Promise<ConvertedManifest> {
  const parsed = parseImageManifest(manifest, src.name);
  const configBytes = await readSmallBlob(src, parsed.config, 'config');
  const config = parseConfig(configBytes, src.name, parsed.config.digest);
  if (options.expectPlatform && !platformMatches(config, options.expectPlatform)) {
    throw new UserError(`${src.name}: the image is ${formatPlatform(config)}, not ${formatPlatform(options.expectPlatform)}`);
  }
  const diffIDs = config.rootfs?.diff_ids ?? [];
  if (diffIDs.length !== parsed.layers.length) {
    throw new UserError(
      `${src.name}: config ${short(parsed.config.digest)} lists ${diffIDs.length} diff_ids for ${parsed.layers.length} layers`,
    );
  }
  if (options.recorded) {
    for (const index of options.recorded.keys()) {
      if (index >= parsed.layers.length)
        throw new UserError(`--record-in names layer ${index}, but ${manifest.digest} has ${parsed.layers.length} layers`);
    }
  }

  const missingPerLayer: string[][] = [];
  const uploads: Promise<unknown>[] = [];
  const results: LayerResult[] = [];
  try {
    for (const [i, layer] of parsed.layers.entries()) {
      const diffID = itemAt(diffIDs, i); // as many as layers, checked above
      const missing: string[] = [];
      missingPerLayer.push(missing);
      const result = await convertLayer(
        {
          source: src,
          layer,
          diffID,
          label: `layer ${i + 1}/${parsed.layers.length}`,
          prioritized: options.recorded ? options.recorded.get(i) : options.prioritizedFiles,
          missing: options.recorded ? undefined : missing,
        },
        options,
      );
      results.push(result);
      // Upload while the next layer converts; a kept layer is mounted or copied from the source.
      const file = result.file;
      const upload = file
        ? dst.putBlob(result.layer, async () => file)
        : dst.putBlob(result.layer, () => downloadBlob(src, layer, join(options.tmpDir, `copy-${layer.digest.slice(7)}`)), src);
      upload.catch(() => undefined); // awaited below
      uploads.push(upload);
    }
  } finally {
    await Promise.allSettled(uploads);
  }
  for (const upload of uploads) await upload; // surface the first failure

  config.rootfs = { type: config.rootfs?.type ?? 'layers', diff_ids: results.map((r) => r.diffID) };
  const newConfig = Buffer.from(JSON.stringify(config));
  const configDescriptor: Descriptor = { mediaType: MediaType.OciConfig, digest: digestOf(newConfig), size: newConfig.length };
  const configFile = join(options.tmpDir, `config-${configDescriptor.digest.slice(7)}`);
  await writeFile(configFile, newConfig);
  // Mounting is tried first: an unchanged config (all layers kept) is already in the source.
  await dst.putBlob(configDescriptor, async () => configFile, src);

  const out: ImageManifest = {
    schemaVersion: 2,
    mediaType: MediaType.OciManifest,
    config: configDescriptor,
    layers: results.map((r) => r.layer),
  };
  if (parsed.annotations) out.annotations = parsed.annotations;
  const bytes = Buffer.from(JSON.stringify(out));
  // A path is missing from the image only if no layer held it.
  const missing = (options.prioritizedFiles ?? []).filter((path) => missingPerLayer.every((m) => m.includes(path)));
  return { bytes, mediaType: MediaType.OciManifest, digest: digestOf(bytes), missing };
}

export function parseImageManifest(manifest: Manifest, where: string): ImageManifest {
  let parsed: ImageManifest;
  try {
    parsed = JSON.parse(manifest.bytes.toString('utf8')) as ImageManifest;
  } catch (error) {
    throw new UserError(`${where}: manifest ${manifest.digest} is not JSON: ${(error as Error).message}`);
  }
  if (parsed?.schemaVersion !== 2 || !parsed.config?.digest || !Array.isArray(parsed.layers)) {
    throw new UserError(
      `${where}: manifest ${manifest.digest} (${manifest.mediaType || 'no media type'}) is not an OCI or Docker v2 image manifest`,
    );
  }
  return parsed;
}

export function parseConfig(bytes: Buffer, where: string, digest: string): ImageConfig {
  try {
    const config = JSON.parse(bytes.toString('utf8')) as ImageConfig;
    if (typeof config !== 'object' || config === null) throw new Error('not an object');
    return config;
  } catch (error) {
    throw new UserError(`${where}: config ${digest} is not a JSON object: ${(error as Error).message}`);
  }
}
