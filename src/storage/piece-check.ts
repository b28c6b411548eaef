// What the piece journal records to recognize a piece's bytes after a crash. A swarm peer
// records the SHA-256 (it reports piece digests to the scheduler and serves them to children); a
// peer outside a swarm only needs to catch a torn write, which a CRC does for far less: CRC-32C
// on the CPU's instruction when native/digest is built, else zlib's CRC-32. The whole blob is
// verified against its digest either way before it counts as complete. Checks are computed off
// the JavaScript thread where the addon allows (common/hashing.ts).
import { crc32 } from 'node:zlib';
import { crc32c, sha256Hex } from '../common/hashing.js';

/** "<64 hex>" (SHA-256, the journal's original form), "crc32c:<8 hex>" or "crc32:<8 hex>". */
export type PieceCheck = string;

/** 'sha256' when the check must be a digest others can trust, 'crc' when it only guards this disk. */
export type PieceCheckKind = 'sha256' | 'crc';

const hex8 = (value: number) => (value >>> 0).toString(16).padStart(8, '0');

export async function pieceCheck(kind: PieceCheckKind, bytes: Uint8Array): Promise<PieceCheck> {
  if (kind === 'sha256') return sha256Hex(bytes);
  const castagnoli = crc32c(bytes);
  return castagnoli ? `crc32c:${hex8(await castagnoli)}` : `crc32:${hex8(crc32(bytes))}`;
}

/** A check written by an earlier process; anything else is not one. */
export function isPieceCheck(text: string): boolean {
  return /^[0-9a-f]{64}$/.test(text) || /^crc32c?:[0-9a-f]{8}$/.test(text);
}

/** The piece's SHA-256 when that is what the check is. */
export function checkSha256(check: PieceCheck): string | undefined {
  return check.length === 64 ? check : undefined;
}

/** Whether `bytes` still match a recorded check (a CRC-32C this build cannot compute does not). */
export async function checkMatches(check: PieceCheck, bytes: Uint8Array): Promise<boolean> {
  if (check.startsWith('crc32:')) return check === `crc32:${hex8(crc32(bytes))}`;
  if (check.startsWith('crc32c:')) {
    const castagnoli = crc32c(bytes);
    return castagnoli !== undefined && check === `crc32c:${hex8(await castagnoli)}`;
  }
  return (await sha256Hex(bytes)) === check;
}
