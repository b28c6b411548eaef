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
