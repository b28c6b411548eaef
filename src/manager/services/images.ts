import { isIP } from 'node:net';
import { request } from 'undici';
import { z } from 'zod';
import { formatPlatform, platformMatches, type Platform } from '../../convert/platform.js';
import { parseChallenge, RegistryClient, RegistryError, type Credentials } from '../../oci/client.js';
import { MediaType } from '../../oci/media-types.js';
import { formatImageReference, type ImageReference } from '../../oci/reference.js';
import { RegistryHosts } from '../../oci/registry-hosts.js';
import { ManagerError } from '../errors.js';

/*
 * What a preheat needs from the registry: the platform's manifest (through an index if there is
 * one), its layers, and a header that lets a peer read those layers as the job's credentials
 * would. Every registry problem becomes a ManagerError naming it, so POST /jobs can refuse early.
 */

export interface Layer {
  digest: string;
  size: number;
  mediaType: string;
}

/** Where a peer reads an image's blobs, and with which headers. */
export interface BlobOrigin {
  /** The registry's URL of a blob. */
  blobUrl(digest: string): string;
  /** Headers a peer sends with those reads (Basic or a registry Bearer token), possibly none. */
  originHeaders: Record<string, string>;
}

export interface ResolvedImage extends BlobOrigin {
  reference: string;
  manifestDigest: string;
  platform: string;
  layers: Layer[];
  /** The image config: a blob every pull reads too, so a preheat fetches it with the layers. */
  config: Layer;
}

const descriptorSchema = z.object({
  mediaType: z.string().optional(),
  digest: z.string().regex(/^sha256:[0-9a-f]{64}$/, 'must be a sha256 digest'),
  size: z.number().int().min(0),
  platform: z.object({ os: z.string(), architecture: z.string(), variant: z.string().optional() }).optional(),
  urls: z.array(z.string()).optional(),
});
const indexSchema = z.object({ manifests: z.array(descriptorSchema) });
const manifestSchema = z.object({ config: descriptorSchema, layers: z.array(descriptorSchema) });
const configSchema = z.object({ os: z.string().optional(), architecture: z.string().optional(), variant: z.string().optional() });

const INDEX_TYPES = new Set<string>([MediaType.OciIndex, MediaType.DockerManifestList]);

/** Docker treats loopback registries as insecure (plain HTTP) without being told; so does the manager. */
export function isLoopbackRegistry(registry: string): boolean {
  const host = registry
    .replace(/:\d+$/, '')
    .replace(/^\[(.*)\]$/, '$1')
    .toLowerCase();
  if (host === 'localhost') return true;
  if (isIP(host) === 4) return host.startsWith('127.');
  return host === '::1';
}

export async function resolveImage(
  ref: ImageReference,
  platform: Platform,
  options: { credentials?: Credentials; insecure: boolean },
): Promise<ResolvedImage> {
  const hosts = new RegistryHosts(options.insecure ? [ref.registry] : []);
  const client = new RegistryClient(ref.registry, { hosts, credentials: options.credentials, userAgent: 'starling-manager' });
  const reference = formatImageReference(ref);
  try {
    let manifest = await client.getManifest(ref.repository, ref.digest ?? ref.tag ?? 'latest');
    let parsed = parseJson(manifest.bytes, reference);
    const fromIndex = INDEX_TYPES.has(manifest.mediaType) || Array.isArray((parsed as { manifests?: unknown }).manifests);
    if (fromIndex) {
      const index = check(indexSchema, parsed, `image ${reference}: the index`);
      const match = index.manifests.find((m) => platformMatches(m.platform, platform));
      if (!match) {
        const available = index.manifests.map((m) => formatPlatform(m.platform)).join(', ') || 'none';
        throw new ManagerError(
          422,
          'platform_not_found',
          `platform: image ${reference} has no ${formatPlatform(platform)} manifest (it has: ${available})`,
        );
      }
      manifest = await client.getManifest(ref.repository, match.digest);
      parsed = parseJson(manifest.bytes, reference);
    }
    const image = check(manifestSchema, parsed, `image ${reference}: the manifest`);
    if (!fromIndex) {
      // A single-platform image says its platform only in its config (an index's entry is authoritative, as for containerd).
      const { body } = await client.getBlob(ref.repository, image.config.digest);
      const config = check(configSchema, parseJson(Buffer.from(await readAll(body)), reference), `image ${reference}: the config`);
      if (!platformMatches(config, platform)) {
        throw new ManagerError(
          422,
          'platform_not_found',
          `platform: image ${reference} is ${formatPlatform(config)}, not ${formatPlatform(platform)}`,
        );
      }
    }
    // Foreign layers (with `urls`) are not in the registry; peers could not fetch them from it.
    const layers = image.layers
      .filter((l) => !l.urls?.length)
      .map((l) => ({ digest: l.digest, size: l.size, mediaType: l.mediaType ?? '' }));
    const [firstLayer] = layers;
    if (!firstLayer) throw new ManagerError(422, 'image_has_no_layers', `image: ${reference} has no layers to preheat`);
    const origin = await originAccess(client.baseUrl, ref, firstLayer.digest, options.credentials);
    const config = { digest: image.config.digest, size: image.config.size, mediaType: image.config.mediaType ?? '' };
    return { reference, manifestDigest: manifest.digest, platform: formatPlatform(platform), layers, config, ...origin };
  } catch (error) {
    throw asManagerError(error, reference);
  } finally {
    await client.close();
  }
}

/**
 * Where and how peers read an image's blobs, found again without the manifest: what a replica
 * that takes over a job needs (the job's layers are in its rows). `sampleDigest` is one of them.
 */
export async function resolveOrigin(
  ref: ImageReference,
  sampleDigest: string,
  options: { credentials?: Credentials; insecure: boolean },
): Promise<BlobOrigin> {
  const hosts = new RegistryHosts(options.insecure ? [ref.registry] : []);
  try {
    return await originAccess(hosts.baseUrl(ref.registry), ref, sampleDigest, options.credentials);
  } catch (error) {
    throw asManagerError(error, formatImageReference(ref));
  }
}

async function originAccess(
  base: URL,
  ref: ImageReference,
  sampleDigest: string,
  credentials: Credentials | undefined,
): Promise<BlobOrigin> {
  const blobUrl = (digest: string) => new URL(`/v2/${ref.repository}/blobs/${digest}`, base).href;
  const originHeaders = await originAuthorization(blobUrl(sampleDigest), ref.repository, credentials, formatImageReference(ref));
  return { blobUrl, originHeaders };
}

/**
 * The header a peer needs to read blobs: none for a public repository, Basic for a registry
 * asking for Basic, else a pull token from the registry's token service (it lives as long as the
 * registry grants, typically minutes: peers should start at once, which they do on a preheat).
 */
async function originAuthorization(
  url: string,
  repository: string,
  credentials: Credentials | undefined,
  reference: string,
): Promise<Record<string, string>> {
  const probe = await request(url, { method: 'HEAD', headersTimeout: 15_000 });
  await probe.body.dump();
  if (probe.statusCode !== 401) return {};
  const challenge = parseChallenge(String(probe.headers['www-authenticate'] ?? ''));
  const basic = credentials ? `Basic ${Buffer.from(`${credentials.username}:${credentials.password}`).toString('base64')}` : undefined;
  let header: string | undefined;
  if (challenge?.scheme === 'basic') {
    header = basic;
  } else if (challenge?.scheme === 'bearer' && challenge.params.realm) {
    const tokenUrl = new URL(challenge.params.realm);
    if (challenge.params.service) tokenUrl.searchParams.set('service', challenge.params.service);
    tokenUrl.searchParams.set('scope', `repository:${repository}:pull`);
    const res = await request(tokenUrl, { headers: basic ? { authorization: basic } : {}, headersTimeout: 15_000 });
    const body = (await res.body.json().catch(() => ({}))) as { token?: string; access_token?: string };
    const token = body.token ?? body.access_token;
    if (res.statusCode === 200 && token) header = `Bearer ${token}`;
  }
  if (!header)
    throw new ManagerError(
      422,
      'registry_auth_refused',
      `credentials: the registry of ${reference} refuses to hand out its layers without credentials`,
    );
  const check = await request(url, { method: 'HEAD', headers: { authorization: header }, headersTimeout: 15_000 });
  await check.body.dump();
  if (check.statusCode !== 200)
    throw new ManagerError(
      422,
      'registry_auth_refused',
      `credentials: the registry of ${reference} refused them for its layers (HTTP ${check.statusCode})`,
    );
  return { authorization: header };
}

function asManagerError(error: unknown, reference: string): ManagerError {
  if (error instanceof ManagerError) return error;
  if (error instanceof RegistryError) {
    if (error.status === 401 || error.status === 403 || error.code === 'UNAUTHORIZED' || error.code === 'DENIED') {
      return new ManagerError(422, 'registry_auth_refused', `credentials: ${error.message}`);
    }
    if (error.status === 404 || error.code === 'MANIFEST_UNKNOWN' || error.code === 'NAME_UNKNOWN' || error.code === 'BLOB_UNKNOWN') {
      return new ManagerError(422, 'image_not_found', `image: ${reference} was not found: ${error.message}`);
    }
    if (error.status === 0)
      return new ManagerError(502, 'registry_unreachable', `image: cannot reach the registry of ${reference}: ${error.message}`);
    return new ManagerError(502, 'registry_error', `image: ${error.message}`);
  }
  return new ManagerError(502, 'registry_unreachable', `image: cannot reach the registry of ${reference}: ${(error as Error).message}`);
}

function parseJson(bytes: Buffer, reference: string): unknown {
  try {
    return JSON.parse(bytes.toString('utf8'));
  } catch (error) {
    throw new ManagerError(422, 'bad_manifest', `image: ${reference} has a document that is not JSON: ${(error as Error).message}`);
  }
}

function check<S extends z.ZodType>(schema: S, value: unknown, what: string): z.output<S> {
  const result = schema.safeParse(value);
  if (!result.success) {
    const [issue] = result.error.issues;
    throw new ManagerError(
      422,
      'bad_manifest',
      `image: ${what} is malformed at ${issue?.path.join('.') || '(top)'}: ${issue?.message ?? 'not as expected'}`,
    );
  }
  return result.data;
}

async function readAll(body: AsyncIterable<Uint8Array>, limit = 4 * 1024 * 1024): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += chunk.length;
    if (size > limit) throw new ManagerError(422, 'bad_manifest', `image config is larger than ${limit} bytes`);
    chunks.push(Buffer.from(chunk));
  }
  return Buffer.concat(chunks);
}
