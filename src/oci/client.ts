import { createReadStream } from 'node:fs';
import type { Readable } from 'node:stream';
import { request } from 'undici';
import { UserError } from '../common/errors.js';
import { digestOf } from './digest.js';
import { ALL_MANIFEST_TYPES } from './media-types.js';
import { RegistryHosts } from './registry-hosts.js';
import { RegistryTransport, type TransportResponse } from './transport.js';
import { itemAt } from '../common/indexing.js';

/**
 * A registry client for tools (convert, estargz on registry layers): manifests, blobs, ranged
 * blob reads, monolithic uploads, cross-repository mounts and manifest pushes, with the Docker
 * auth dance: anonymous first; on 401, Basic (when credentials are given) or a Bearer token
 * fetched from the challenge's realm, cached per scope.
 */

export interface Credentials {
  username: string;
  password: string;
}

/** Parses `user:pass` (the password may contain ':'). */
export function parseCredentials(text: string, flag = '--creds'): Credentials {
  const colon = text.indexOf(':');
  if (colon <= 0) throw new UserError(`${flag} must be USER:PASSWORD`);
  return { username: text.slice(0, colon), password: text.slice(colon + 1) };
}

/** A registry refused or failed a request; the message names registry, repository, status and the registry's words. */
export class RegistryError extends UserError {
  override name = 'RegistryError';
  constructor(
    message: string,
    readonly status: number,
    /** The first OCI error code in the body (MANIFEST_UNKNOWN, DENIED...), if any. */
    readonly code?: string,
  ) {
    super(message);
  }
}

export interface Manifest {
  bytes: Buffer;
  mediaType: string;
  digest: string;
}

export interface RegistryClientOptions {
  hosts?: RegistryHosts;
  credentials?: Credentials;
  transport?: RegistryTransport;
  userAgent?: string;
}

interface Challenge {
  scheme: string;
  params: Record<string, string>;
}

type Method = 'GET' | 'HEAD' | 'POST' | 'PUT';

interface SendOptions {
  method: Method;
  /** Path and query below the registry's base URL, or an absolute URL (upload locations). */
  target: string | URL;
  /** Token scope(s) this request needs, e.g. `repository:a/b:pull`. */
  scopes: string[];
  headers?: Record<string, string>;
  /** Re-creatable body (a retry after a 401 needs a fresh stream). */
  body?: () => Readable | Buffer;
  /** What the request does, for error messages. */
  what: string;
  repository: string;
}

interface Response {
  statusCode: number;
  headers: Record<string, string | string[] | undefined>;
  body: TransportResponse['body'];
}

export class RegistryClient {
  readonly baseUrl: URL;
  private readonly transport: RegistryTransport;
  private readonly ownTransport: boolean;
  private readonly credentials?: Credentials;
  private readonly userAgent: string;
  /** The scheme the registry asked for last: after a Basic challenge, credentials go out up front. */
  private basic = false;
  private readonly tokens = new Map<string, { header: string; expires: number }>();

  constructor(
    readonly registry: string,
    options: RegistryClientOptions = {},
  ) {
    this.baseUrl = (options.hosts ?? new RegistryHosts()).baseUrl(registry);
    this.transport = options.transport ?? new RegistryTransport({ connections: 16 });
    this.ownTransport = !options.transport;
    this.credentials = options.credentials;
    this.userAgent = options.userAgent ?? 'starling';
  }

  async close(): Promise<void> {
    if (this.ownTransport) await this.transport.close();
  }

  /** GET a manifest (any OCI/Docker type); the bytes are checked against a digest reference. */
  async getManifest(repository: string, reference: string): Promise<Manifest> {
    const res = await this.send({
      method: 'GET',
      target: `/v2/${repository}/manifests/${reference}`,
      scopes: [pull(repository)],
      headers: { accept: ALL_MANIFEST_TYPES },
      what: `GET manifest ${reference}`,
      repository,
    });
    await this.expect(res, [200], `GET manifest ${reference}`, repository);
    const bytes = Buffer.from(await res.body.arrayBuffer());
    const digest = digestOf(bytes);
    if (reference.includes(':') && reference !== digest) {
      throw new RegistryError(
        `${this.where(repository)}: manifest ${reference} has digest ${digest}: the registry served other content`,
        200,
      );
    }
    const mediaType = headerValue(res.headers['content-type'])?.split(';')[0]?.trim() || mediaTypeOf(bytes);
    return { bytes, mediaType, digest };
  }

  /** HEAD a manifest: its digest and media type, or undefined when the registry does not have it. */
  async headManifest(repository: string, reference: string): Promise<{ digest?: string; mediaType?: string } | undefined> {
    const res = await this.send({
      method: 'HEAD',
      target: `/v2/${repository}/manifests/${reference}`,
      scopes: [pull(repository)],
      headers: { accept: ALL_MANIFEST_TYPES },
      what: `HEAD manifest ${reference}`,
      repository,
    });
    if (res.statusCode === 404) return undefined;
    await this.expect(res, [200], `HEAD manifest ${reference}`, repository);
    return { digest: headerValue(res.headers['docker-content-digest']), mediaType: headerValue(res.headers['content-type']) };
  }

  /** PUT a manifest under a tag or its digest; returns its digest. */
  async putManifest(repository: string, reference: string, bytes: Buffer, mediaType: string): Promise<string> {
    const what = `PUT manifest ${reference}`;
    const res = await this.send({
      method: 'PUT',
      target: `/v2/${repository}/manifests/${reference}`,
      scopes: [push(repository)],
      headers: { 'content-type': mediaType, 'content-length': String(bytes.length) },
      body: () => bytes,
      what,
      repository,
    });
    await this.expect(res, [200, 201], what, repository);
    await res.body.dump();
    return digestOf(bytes);
  }

  /** The blob's size, or undefined when the repository does not have it. */
  async headBlob(repository: string, digest: string): Promise<number | undefined> {
    const res = await this.send({
      method: 'HEAD',
      target: `/v2/${repository}/blobs/${digest}`,
      scopes: [pull(repository)],
      what: `HEAD blob ${digest}`,
      repository,
    });
    if (res.statusCode === 404) return undefined;
    await this.expect(res, [200], `HEAD blob ${digest}`, repository);
    return Number(headerValue(res.headers['content-length']) ?? Number.NaN);
  }

  /** The whole blob as a stream (unverified: the caller hashes what it reads). */
  async getBlob(repository: string, digest: string): Promise<{ size: number; body: Readable }> {
    const res = await this.send({
      method: 'GET',
      target: `/v2/${repository}/blobs/${digest}`,
      scopes: [pull(repository)],
      what: `GET blob ${digest}`,
      repository,
    });
    await this.expect(res, [200], `GET blob ${digest}`, repository);
    return { size: Number(headerValue(res.headers['content-length']) ?? Number.NaN), body: res.body };
  }

  /** Exactly [offset, offset+length) of a blob, with one Range request; a registry ignoring Range is an error. */
  async readBlobRange(repository: string, digest: string, offset: number, length: number): Promise<Buffer> {
    if (length === 0) return Buffer.alloc(0);
    const range = `bytes=${offset}-${offset + length - 1}`;
    const what = `GET blob ${digest} (${range})`;
    const res = await this.send({
      method: 'GET',
      target: `/v2/${repository}/blobs/${digest}`,
      scopes: [pull(repository)],
      headers: { range },
      what,
      repository,
    });
    await this.expect(res, [206, 200], what, repository);
    if (res.statusCode !== 206) {
      await res.body.dump();
      throw new RegistryError(`${this.where(repository)}: ${what}: the registry ignored the Range header (HTTP 200)`, 200);
    }
    const contentRange = headerValue(res.headers['content-range']) ?? '';
    const match = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(contentRange);
    if (!match || Number(match[1]) !== offset || Number(match[2]) !== offset + length - 1) {
      await res.body.dump();
      throw new RegistryError(`${this.where(repository)}: ${what}: answered Content-Range "${contentRange}"`, 206);
    }
    const bytes = Buffer.from(await res.body.arrayBuffer());
    if (bytes.length !== length) throw new RegistryError(`${this.where(repository)}: ${what}: got ${bytes.length} of ${length} bytes`, 206);
    return bytes;
  }

  /**
   * Makes a blob exist in `repository`: nothing if it is there, a cross-repository mount from
   * `from` when given, else (or when the registry answers 202 without mounting) a monolithic
   * upload streamed from the file `localFile()` gives (called only when an upload is needed).
   * Returns how the blob got there.
   */
  async putBlob(
    repository: string,
    blob: { digest: string; size: number },
    options: { from?: string; localFile?: () => Promise<string> } = {},
  ): Promise<'exists' | 'mounted' | 'uploaded'> {
    if ((await this.headBlob(repository, blob.digest)) !== undefined) return 'exists';
    let location: URL;
    const from = options.from;
    if (from && from !== repository) {
      const what = `mount blob ${blob.digest} from ${from}`;
      const query = new URLSearchParams({ mount: blob.digest, from });
      const res = await this.send({
        method: 'POST',
        target: `/v2/${repository}/blobs/uploads/?${query}`,
        scopes: [push(repository), pull(from)],
        headers: { 'content-length': '0' },
        what,
        repository,
      });
      await this.expect(res, [201, 202], what, repository);
      await res.body.dump();
      if (res.statusCode === 201) return 'mounted';
      location = this.uploadLocation(res, repository, what);
    } else {
      location = await this.startUpload(repository);
    }
    if (!options.localFile)
      throw new UserError(`${this.where(repository)}: blob ${blob.digest} could not be mounted and there is no local copy to upload`);
    await this.finishUpload(repository, location, { ...blob, file: await options.localFile() });
    return 'uploaded';
  }

  private async startUpload(repository: string): Promise<URL> {
    const what = 'start blob upload';
    const res = await this.send({
      method: 'POST',
      target: `/v2/${repository}/blobs/uploads/`,
      scopes: [push(repository)],
      headers: { 'content-length': '0' },
      what,
      repository,
    });
    await this.expect(res, [202], what, repository);
    await res.body.dump();
    return this.uploadLocation(res, repository, what);
  }

  private uploadLocation(res: Response, repository: string, what: string): URL {
    const location = headerValue(res.headers.location);
    if (!location)
      throw new RegistryError(`${this.where(repository)}: ${what}: HTTP ${res.statusCode} without a Location header`, res.statusCode);
    return new URL(location, this.baseUrl);
  }

  private async finishUpload(repository: string, location: URL, blob: { digest: string; size: number; file: string }): Promise<void> {
    const url = new URL(location);
    url.searchParams.set('digest', blob.digest);
    const what = `upload blob ${blob.digest}`;
    const res = await this.send({
      method: 'PUT',
      target: url,
      scopes: [push(repository)],
      what,
      repository,
      headers: { 'content-type': 'application/octet-stream', 'content-length': String(blob.size) },
      body: () => createReadStream(blob.file, { highWaterMark: 1 << 20 }),
    });
    await this.expect(res, [201, 204], what, repository);
    await res.body.dump();
  }

  /** Sends a request with whatever auth is known; on 401 answers the challenge once and retries. */
  private async send(options: SendOptions): Promise<Response> {
    const first = await this.attempt(options, this.authorization(options.scopes));
    if (first.statusCode !== 401) return first;
    const challenge = parseChallenge(headerValue(first.headers['www-authenticate']) ?? '');
    await first.body.dump();
    const where = `${this.where(options.repository)}: ${options.what}`;
    let header: string;
    if (challenge?.scheme === 'basic') {
      if (!this.credentials)
        throw new RegistryError(`${where}: the registry requires credentials (HTTP 401, Basic auth)`, 401, 'UNAUTHORIZED');
      this.basic = true;
      header = basicHeader(this.credentials);
    } else if (challenge?.scheme === 'bearer') {
      header = await this.fetchToken(challenge, options);
    } else {
      throw new RegistryError(`${where}: HTTP 401 with an unsupported or missing WWW-Authenticate challenge`, 401, 'UNAUTHORIZED');
    }
    const second = await this.attempt(options, header);
    if (second.statusCode === 401) {
      const detail = await errorDetail(second);
      throw new RegistryError(
        `${where}: the registry refused the ${this.credentials ? 'credentials' : 'anonymous token'} (HTTP 401${detail})`,
        401,
        'UNAUTHORIZED',
      );
    }
    return second;
  }

  private async attempt(options: SendOptions, authorization: string | undefined): Promise<Response> {
    const url = typeof options.target === 'string' ? new URL(options.target, this.baseUrl) : options.target;
    const headers: Record<string, string> = { 'user-agent': this.userAgent, ...options.headers };
    // Credentials stay with the registry: an upload location elsewhere gets none.
    if (authorization && url.origin === this.baseUrl.origin) headers.authorization = authorization;
    try {
      if (options.method === 'GET' || options.method === 'HEAD') {
        return await this.transport.send(url, { method: options.method, headers });
      }
      const res = await request(url, { method: options.method, headers, body: options.body?.(), dispatcher: this.transport.dispatcher });
      return { statusCode: res.statusCode, headers: res.headers, body: res.body };
    } catch (error) {
      throw new RegistryError(`${this.where(options.repository)}: ${options.what}: ${(error as Error).message}`, 0);
    }
  }

  private authorization(scopes: string[]): string | undefined {
    const token = this.tokens.get(scopeKey(scopes));
    if (token && token.expires > Date.now()) return token.header;
    if (this.basic && this.credentials) return basicHeader(this.credentials);
    return undefined;
  }

  private async fetchToken(challenge: Challenge, options: SendOptions): Promise<string> {
    const where = `${this.where(options.repository)}: ${options.what}`;
    const realm = challenge.params.realm;
    if (!realm) throw new RegistryError(`${where}: Bearer challenge without a realm`, 401);
    const url = new URL(realm);
    if (challenge.params.service) url.searchParams.set('service', challenge.params.service);
    // Ask for every scope the operation needs (a mount needs push here and pull there).
    const scopes = new Set([...options.scopes, ...(challenge.params.scope ? challenge.params.scope.split(' ') : [])]);
    for (const scope of scopes) url.searchParams.append('scope', scope);
    const headers: Record<string, string> = { 'user-agent': this.userAgent };
    if (this.credentials) headers.authorization = basicHeader(this.credentials);
    let res;
    try {
      res = await request(url, { headers, dispatcher: this.transport.dispatcher });
    } catch (error) {
      throw new RegistryError(`${where}: token request to ${url.origin}: ${(error as Error).message}`, 0);
    }
    if (res.statusCode !== 200) {
      const detail = await errorDetail(res);
      const refused = res.statusCode === 401 || res.statusCode === 403;
      throw new RegistryError(
        `${where}: the token service at ${url.origin} ${refused ? 'refused the credentials' : 'failed'} (HTTP ${res.statusCode}${detail})`,
        res.statusCode,
        'UNAUTHORIZED',
      );
    }
    const body = (await res.body.json().catch(() => ({}))) as { token?: string; access_token?: string; expires_in?: number };
    const token = body.token ?? body.access_token;
    if (!token) throw new RegistryError(`${where}: the token service at ${url.origin} answered without a token`, 200);
    const header = `Bearer ${token}`;
    // Renew a little early; 60 s is the spec's default lifetime.
    const expires = Date.now() + Math.max(10, (body.expires_in ?? 60) - 10) * 1000;
    this.tokens.set(scopeKey(options.scopes), { header, expires });
    return header;
  }

  private async expect(res: Response, ok: number[], what: string, repository: string): Promise<void> {
    if (ok.includes(res.statusCode)) return;
    const { detail, code } = await readError(res);
    throw new RegistryError(`${this.where(repository)}: ${what}: HTTP ${res.statusCode}${detail}`, res.statusCode, code);
  }

  private where(repository: string): string {
    return `registry ${this.registry}, repository ${repository}`;
  }
}

function pull(repository: string): string {
  return `repository:${repository}:pull`;
}

function push(repository: string): string {
  return `repository:${repository}:pull,push`;
}

function scopeKey(scopes: string[]): string {
  return [...scopes].sort().join(' ');
}

function basicHeader(credentials: Credentials): string {
  return `Basic ${Buffer.from(`${credentials.username}:${credentials.password}`).toString('base64')}`;
}

function headerValue(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value;
}

/** The manifest's own mediaType field, when the registry sent no Content-Type. */
function mediaTypeOf(bytes: Buffer): string {
  try {
    return String((JSON.parse(bytes.toString('utf8')) as { mediaType?: string }).mediaType ?? '');
  } catch {
    return '';
  }
}

/** Parses `Bearer realm="...",service="...",scope="..."` (RFC 7235 auth-params, quoted or not). */
export function parseChallenge(header: string): Challenge | undefined {
  const [, scheme, rest] = /^\s*([A-Za-z]+)\s*(.*)$/s.exec(header) ?? [];
  if (scheme === undefined || rest === undefined) return undefined;
  const params: Record<string, string> = {};
  const param = /([A-Za-z_-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))\s*,?\s*/gy;
  let m: RegExpExecArray | null;
  while ((m = param.exec(rest)) !== null && m[0] !== '') {
    const [, , quoted, bare] = m;
    params[itemAt(m, 1).toLowerCase()] = quoted !== undefined ? quoted.replace(/\\(.)/g, '$1') : (bare ?? '');
  }
  return { scheme: scheme.toLowerCase(), params };
}

async function readError(res: { body: Response['body'] }): Promise<{ detail: string; code?: string }> {
  let text = '';
  try {
    text = (await res.body.text()).slice(0, 4096);
  } catch {
    return { detail: '' };
  }
  try {
    const parsed = JSON.parse(text) as { errors?: Array<{ code?: string; message?: string; detail?: unknown }> };
    const first = parsed.errors?.[0];
    if (first) {
      const detail = first.detail === undefined || first.detail === null ? '' : `; ${JSON.stringify(first.detail).slice(0, 300)}`;
      return { detail: ` ${first.code ?? ''}: ${first.message ?? ''}${detail}`.replace(/ : /, ' '), code: first.code };
    }
  } catch {
    // not an OCI error body
  }
  const plain = text.trim().replace(/\s+/g, ' ').slice(0, 300);
  return { detail: plain ? ` ${plain}` : '' };
}

async function errorDetail(res: { body: Response['body'] }): Promise<string> {
  const { detail } = await readError(res);
  return detail ? `,${detail}` : '';
}
