// Validating what arrives on a wire: one schema per body, beside its type in this folder, and
// one error that names every field that is wrong.
import { z } from 'zod';
import { formatIssues } from '../common/config.js';

/** A body that does not match its contract; the message names the fields at fault. */
export class WireError extends Error {
  override name = 'WireError';
}

/** `value` as `schema` reads it, or a WireError naming `what` and each problem ("bad seed request: pieceSize: ..."). */
export function parseWire<S extends z.ZodType>(schema: S, value: unknown, what: string): z.output<S> {
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  const problems = formatIssues(result.error)
    .split('\n')
    .map((line) => line.replace(/^\s*- /, ''));
  throw new WireError(`bad ${what}: ${problems.join('; ')}`);
}

/** Fields several contracts share (the peer's, the scheduler's and the manager's). */
export const digestField = z.string().regex(/^sha256:[0-9a-f]{64}$/, 'must be sha256:<64 hex digits>');
export const countField = z.number().int().min(0);
export const portField = z.number().int().min(1).max(65535);
export const ipField = z.string().refine((value) => /^[0-9a-fA-F:.]+$/.test(value) && (value.includes('.') || value.includes(':')), {
  message: 'must be an IPv4 or IPv6 address',
});
