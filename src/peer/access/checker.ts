import { createHash } from 'node:crypto';
import type { Logger } from '../../common/log.js';
import type { RegistryTransport } from '../../oci/transport.js';
import { relayableHeaders } from '../sources/origin-source.js';

/** The registry's word on whether one client may read one blob. */
export interface AccessDecision {
  allowed: boolean;
  status: number;
  headers: Record<string, string>;
  body: string;
}

const ALLOW_TTL_MS = 60_000;
const DENY_TTL_MS = 5_000;
const MAX_ENTRIES = 10_000;

/**
 * Asks the registry (a HEAD of the blob with the client's own credentials) before a private
 * cached blob is handed to that client, and remembers the answer briefly so a pull costs one check
 * per blob rather than one per request.
 */
export class AccessChecker {
  private readonly decisions = new Map<string, { decision: AccessDecision; expires: number }>();

  constructor(
    private readonly transport: RegistryTransport,
    private readonly log: Logger,
  ) {}

  async check(blobUrl: URL, authorization: string | undefined): Promise<AccessDecision> {
    const key = `${blobUrl.href}|${authorization ? createHash('sha256').update(authorization).digest('hex') : '-'}`;
    const cached = this.decisions.get(key);
    if (cached && cached.expires > Date.now()) return cached.decision;
    const decision = await this.ask(blobUrl, authorization);
    this.remember(key, decision);
    return decision;
  }

  /** Records a decision learnt elsewhere (the probe that created a task was such a check). */
  record(blobUrl: URL, authorization: string | undefined, decision: AccessDecision): void {
    const key = `${blobUrl.href}|${authorization ? createHash('sha256').update(authorization).digest('hex') : '-'}`;
    this.remember(key, decision);
  }

  private remember(key: string, decision: AccessDecision): void {
    if (this.decisions.size >= MAX_ENTRIES) {
      const now = Date.now();
      for (const [k, v] of this.decisions) if (v.expires <= now) this.decisions.delete(k);
      if (this.decisions.size >= MAX_ENTRIES) this.decisions.clear();
    }
    this.decisions.set(key, { decision, expires: Date.now() + (decision.allowed ? ALLOW_TTL_MS : DENY_TTL_MS) });
  }

  private async ask(blobUrl: URL, authorization: string | undefined): Promise<AccessDecision> {
    try {
      const response = await this.transport.send(blobUrl, {
        method: 'HEAD',
        headers: authorization ? { authorization } : {},
      });
      await response.body.dump();
      return {
        allowed: response.statusCode === 200,
        status: response.statusCode,
        headers: relayableHeaders(response.headers),
        body: '',
      };
    } catch (error) {
      // Privacy wins over availability: without the registry's word, a private blob is not served.
      this.log.warn({ url: blobUrl.href, err: (error as Error).message }, 'registry unreachable for an access check');
      return { allowed: false, status: 502, headers: {}, body: '' };
    }
  }
}

/** Whether the registry serves the blob to an anonymous HEAD (so the blob is public there). */
export async function readableAnonymously(transport: RegistryTransport, blobUrl: URL): Promise<boolean> {
  try {
    const response = await transport.send(blobUrl, { method: 'HEAD' });
    await response.body.dump();
    return response.statusCode === 200;
  } catch {
    return false;
  }
}
