// What the piece journal records to recognize a piece's bytes after a crash. A swarm peer
// records the SHA-256 (it reports piece digests to the scheduler and serves them to children); a
// peer outside a swarm only needs to catch a torn write, which a CRC-32 does at a third of the
// cost. The whole blob is verified against its digest either way before it counts as complete.
import { createHash } from 'node:crypto';
import { crc32 } from 'node:zlib';

/** "<64 hex>" (SHA-256, the journal's original form) or "crc32:<8 hex>". */
export type PieceCheck = string;

export type PieceCheckKind = 'sha256' | 'crc32';

export function pieceCheck(kind: PieceCheckKind, bytes: Uint8Array): PieceCheck {
  return kind === 'sha256' ? createHash('sha256').update(bytes).digest('hex') : `crc32:${crc32(bytes).toString(16).padStart(8, '0')}`;
}

/** A check written by an earlier process: SHA-256 hex or crc32:hex; anything else is not one. */
export function isPieceCheck(text: string): boolean {
  return /^[0-9a-f]{64}$/.test(text) || /^crc32:[0-9a-f]{8}$/.test(text);
}

/** The piece's SHA-256 when that is what the check is. */
export function checkSha256(check: PieceCheck): string | undefined {
  return check.length === 64 ? check : undefined;
}

export function checkMatches(check: PieceCheck, bytes: Uint8Array): boolean {
  return pieceCheck(check.startsWith('crc32:') ? 'crc32' : 'sha256', bytes) === check;
}
