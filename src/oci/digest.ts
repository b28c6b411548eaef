import { createHash, type Hash } from 'node:crypto';

/** Digest algorithms Starling can verify; the OCI spec registers these two. */
const ALGORITHMS = { sha256: 64, sha512: 128 } as const;
export type DigestAlgorithm = keyof typeof ALGORITHMS;

/** A validated content digest such as `sha256:<64 hex>`. */
export interface Digest {
  algorithm: DigestAlgorithm;
  hex: string;
  /** The canonical string form, `algorithm:hex`. */
  value: string;
}

const DIGEST_GRAMMAR = /^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$/;

export class DigestError extends Error {
  override name = 'DigestError';
}

/** Parses and validates a digest string; throws a DigestError that says what is wrong. */
export function parseDigest(value: string): Digest {
  if (!DIGEST_GRAMMAR.test(value)) throw new DigestError(`malformed digest "${truncate(value)}"`);
  const colon = value.indexOf(':');
  const algorithm = value.slice(0, colon);
  const hex = value.slice(colon + 1);
  if (!(algorithm in ALGORITHMS)) throw new DigestError(`unsupported digest algorithm "${algorithm}"`);
  const length = ALGORITHMS[algorithm as DigestAlgorithm];
  if (hex.length !== length || !/^[0-9a-f]+$/.test(hex)) {
    throw new DigestError(`malformed ${algorithm} digest: expected ${length} lowercase hex characters`);
  }
  return { algorithm: algorithm as DigestAlgorithm, hex, value };
}

export function createDigester(algorithm: DigestAlgorithm = 'sha256'): Hash {
  return createHash(algorithm);
}

export function digestOf(data: Uint8Array | string, algorithm: DigestAlgorithm = 'sha256'): string {
  return `${algorithm}:${createHash(algorithm).update(data).digest('hex')}`;
}

function truncate(value: string): string {
  return value.length > 80 ? `${value.slice(0, 77)}...` : value;
}
