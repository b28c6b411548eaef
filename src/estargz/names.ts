import { EstargzError } from './errors.js';

/**
 * Normalizes a tar/TOC entry name to the form the Go reader uses as its key ("a/b", root is "").
 * Unlike Go's path.Clean, which silently maps "../x" and "/x" to "x", unsafe names are refused:
 * they only appear in crafted layers and would make two different tar names alias one file.
 */
export function normalizeEntryName(name: string): string {
  if (name.startsWith('/')) throw new EstargzError('UNSAFE_NAME', `absolute entry name "${shorten(name)}"`);
  if (name.includes('\0')) throw new EstargzError('UNSAFE_NAME', `entry name "${shorten(name)}" contains a NUL byte`);
  const parts: string[] = [];
  for (const part of name.split('/')) {
    if (part === '' || part === '.') continue;
    if (part === '..') throw new EstargzError('UNSAFE_NAME', `entry name "${shorten(name)}" contains ".."`);
    parts.push(part);
  }
  return parts.join('/');
}

/**
 * The lenient cleaning the Go builder applies to prioritized-file paths ("/a", "./a" and "../a"
 * all mean "a"): these are user input naming files, not names stored in a layer.
 */
export function cleanPrioritizedName(name: string): string {
  const parts: string[] = [];
  for (const part of name.split('/')) {
    if (part === '' || part === '.') continue;
    if (part === '..') parts.pop();
    else parts.push(part);
  }
  return parts.join('/');
}

export function parentName(name: string): string {
  const slash = name.lastIndexOf('/');
  return slash < 0 ? '' : name.slice(0, slash);
}

export function shorten(text: string, max = 120): string {
  return text.length > max ? `${text.slice(0, max - 3)}...` : text;
}
