import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { UserError } from '../common/errors.js';
import type { Manifest } from '../oci/client.js';
import { digestOf } from '../oci/digest.js';
import { MediaType } from '../oci/media-types.js';
import type { LayerOptions } from './layer.js';
import { convertManifest, isImageManifest, type ManifestOptions } from './manifest.js';
import type { Descriptor, ImageIndex } from './oci-types.js';
import { formatPlatform, hostPlatform, platformMatches, type Platform } from './platform.js';
import { Progress } from './progress.js';
import type { Recording } from './record.js';
import type { ImageStore } from './store.js';

export interface ConvertOptions extends Omit<LayerOptions, 'tmpDir' | 'progress'> {
  prioritizedFiles?: string[];
  recording?: Recording;
  /** Which manifest of an index to convert (default: this host's platform). */
  platform?: Platform;
  /** Convert every manifest of an index and write a new index. */
  allPlatforms?: boolean;
  tmpDir?: string;
  progress?: Progress;
}

export interface ConvertResult {
  /** Digest of what DST's tag now names: an image manifest, or an index with --all-platforms. */
  digest: string;
  mediaType: string;
  /** --prioritized-files entries found in no layer. */
  missingPrioritized: string[];
}

const INDEX_TYPES = new Set<string>([MediaType.OciIndex, MediaType.DockerManifestList]);

/**
 * Converts the image `srcReference` of `src` into `dst` under `dstTag`. The tag is written last:
 * if anything fails, blobs may have been pushed but no manifest is tagged.
 */
export async function convertImage(
  src: ImageStore,
  srcReference: string,
  dst: ImageStore,
  dstTag: string,
  options: ConvertOptions,
): Promise<ConvertResult> {
  const tmp = await mkdtemp(join(options.tmpDir ?? tmpdir(), 'starling-convert-'));
  const base: ManifestOptions = { ...options, tmpDir: tmp, progress: options.progress ?? new Progress() };
  try {
    const top = await src.getManifest(srcReference);
    if (!isIndex(top)) {
      if (!isImageManifest(top.mediaType) && top.mediaType)
        throw new UserError(`${src.name}:${srcReference} is a ${top.mediaType}, not an image`);
      checkRecording(options.recording, [top.digest]);
      const converted = await convertManifest(src, dst, top, {
        ...base,
        expectPlatform: options.platform,
        recorded: options.recording?.get(top.digest),
      });
      await dst.putManifest(converted.bytes, converted.mediaType, dstTag);
      return { digest: converted.digest, mediaType: converted.mediaType, missingPrioritized: converted.missing };
    }
    const index = parseIndex(top, src.name);
    const images = index.manifests.filter((m) => isImageManifest(m.mediaType));
    const chosen = options.allPlatforms
      ? images
      : [pickPlatform(images, options.platform ?? hostPlatform(), `${src.name}:${srcReference}`)];
    checkRecording(
      options.recording,
      chosen.map((m) => m.digest),
    );
    const convertedDescriptors: Descriptor[] = []; // in the index's order
    let missing: string[] | undefined;
    for (const descriptor of chosen) {
      const child = await src.getManifest(descriptor.digest);
      const converted = await convertManifest(src, dst, child, { ...base, recorded: options.recording?.get(child.digest) });
      missing = missing ? missing.filter((p) => converted.missing.includes(p)) : converted.missing;
      if (!options.allPlatforms) {
        await dst.putManifest(converted.bytes, converted.mediaType, dstTag);
        return { digest: converted.digest, mediaType: converted.mediaType, missingPrioritized: missing };
      }
      await dst.putManifest(converted.bytes, converted.mediaType); // by digest, before the index names it
      convertedDescriptors.push({ ...descriptor, mediaType: converted.mediaType, digest: converted.digest, size: converted.bytes.length });
    }
    const newIndex: ImageIndex = {
      schemaVersion: 2,
      mediaType: MediaType.OciIndex,
      manifests: convertedDescriptors,
      ...(index.annotations ? { annotations: index.annotations } : {}),
    };
    const bytes = Buffer.from(JSON.stringify(newIndex));
    await dst.putManifest(bytes, MediaType.OciIndex, dstTag);
    return { digest: digestOf(bytes), mediaType: MediaType.OciIndex, missingPrioritized: missing ?? [] };
  } finally {
    await rm(tmp, { recursive: true, force: true });
  }
}

/**
 * The image manifest `reference` names in `src`: that manifest itself, or, when it is an index,
 * the one for `platform` (default: this host's), as convertImage picks it without --all-platforms.
 */
export async function resolveImageManifest(src: ImageStore, reference: string, platform?: Platform): Promise<Manifest> {
  const top = await src.getManifest(reference);
  if (!isIndex(top)) {
    if (!isImageManifest(top.mediaType) && top.mediaType)
      throw new UserError(`${src.name}:${reference} is a ${top.mediaType}, not an image`);
    return top;
  }
  const images = parseIndex(top, src.name).manifests.filter((m) => isImageManifest(m.mediaType));
  return src.getManifest(pickPlatform(images, platform ?? hostPlatform(), `${src.name}:${reference}`).digest);
}

function isIndex(manifest: Manifest): boolean {
  if (INDEX_TYPES.has(manifest.mediaType)) return true;
  if (manifest.mediaType) return false;
  try {
    return Array.isArray((JSON.parse(manifest.bytes.toString('utf8')) as { manifests?: unknown }).manifests);
  } catch {
    return false;
  }
}

function parseIndex(manifest: Manifest, where: string): ImageIndex {
  try {
    const index = JSON.parse(manifest.bytes.toString('utf8')) as ImageIndex;
    if (!Array.isArray(index.manifests)) throw new Error('"manifests" is not an array');
    return index;
  } catch (error) {
    throw new UserError(`${where}: index ${manifest.digest}: ${(error as Error).message}`);
  }
}

function pickPlatform(manifests: Descriptor[], platform: Platform, where: string): Descriptor {
  const match = manifests.find((m) => platformMatches(m.platform, platform));
  if (match) return match;
  const available = manifests.map((m) => formatPlatform(m.platform)).join(', ') || 'none';
  throw new UserError(`${where} has no manifest for platform ${formatPlatform(platform)} (available: ${available})`);
}

/** A recording made on another image would silently prioritize nothing: refuse it. */
function checkRecording(recording: Recording | undefined, digests: string[]): void {
  if (!recording) return;
  if (!digests.some((d) => recording.has(d))) {
    throw new UserError(
      `--record-in holds records for ${[...recording.keys()].join(', ')}, none of which is the converted manifest (${digests.join(', ')})`,
    );
  }
}
