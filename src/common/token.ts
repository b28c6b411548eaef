import { createHash, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { UserError } from './errors.js';

/** Reads the cluster token shared by peers and schedulers; refuses an empty or unreadable file. */
export function readTokenFile(path: string | undefined): string | undefined {
  if (!path) return undefined;
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    throw new UserError(`cannot read cluster token file ${path}: ${(error as Error).message}`);
  }
  const token = text.trim();
  if (token.length < 16) throw new UserError(`cluster token in ${path} is shorter than 16 characters`);
  if (/\s/.test(token)) throw new UserError(`cluster token in ${path} contains whitespace`);
  return token;
}

/**
 * Whether an Authorization header is `Bearer <token>`, compared in constant time: both sides are
 * hashed first, so neither the token's bytes nor its length show in how long a wrong guess takes.
 */
export function bearerMatches(header: string | undefined, token: string): boolean {
  const given = createHash('sha256')
    .update(header ?? '')
    .digest();
  const expected = createHash('sha256').update(`Bearer ${token}`).digest();
  return timingSafeEqual(given, expected);
}
