import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { parseRate, parseSize } from './units.js';
import { z } from 'zod';
import { UserError } from './errors.js';

/**
 * Loads a process's configuration: the YAML file (if any), then the command-line flags on top
 * (flags win), validated by one schema. Every problem is reported with the key that caused it.
 */
export function loadConfig<S extends z.ZodType>(schema: S, options: { file?: string; flags?: Record<string, unknown> }): z.output<S> {
  let fromFile: unknown = {};
  if (options.file) {
    let text: string;
    try {
      text = readFileSync(options.file, 'utf8');
    } catch (error) {
      throw new UserError(`cannot read config file ${options.file}: ${(error as Error).message}`);
    }
    try {
      fromFile = parseYaml(text) ?? {};
    } catch (error) {
      throw new UserError(`config file ${options.file} is not valid YAML: ${(error as Error).message}`);
    }
    if (typeof fromFile !== 'object' || Array.isArray(fromFile)) {
      throw new UserError(`config file ${options.file} must hold a mapping of keys to values`);
    }
  }
  const merged = deepMerge(fromFile as Record<string, unknown>, dropUndefined(options.flags ?? {}));
  const result = schema.safeParse(merged);
  if (!result.success) {
    const source = options.file ? ` (config file ${options.file} and flags)` : '';
    throw new UserError(`invalid configuration${source}:\n${formatIssues(result.error)}`);
  }
  return result.data;
}

export function formatIssues(error: z.ZodError): string {
  return error.issues
    .map((issue) => {
      const key = issue.path.length ? issue.path.join('.') : '(top level)';
      if (issue.code === 'unrecognized_keys') {
        const prefix = issue.path.length ? `${issue.path.join('.')}.` : '';
        return `  - unknown key ${issue.keys.map((k) => `"${prefix}${k}"`).join(', ')}`;
      }
      return `  - ${key}: ${issue.message}`;
    })
    .join('\n');
}

function dropUndefined(value: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, v] of Object.entries(value)) {
    if (v === undefined) continue;
    out[key] = v && typeof v === 'object' && !Array.isArray(v) ? dropUndefined(v as Record<string, unknown>) : v;
  }
  return out;
}

function deepMerge(base: Record<string, unknown>, over: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = { ...base };
  for (const [key, value] of Object.entries(over)) {
    const current = out[key];
    if (isPlainObject(current) && isPlainObject(value)) out[key] = deepMerge(current, value);
    else out[key] = value;
  }
  return out;
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** A config value given as a number or as text with a unit, parsed by `parse` (sizes, rates). */
function unitField(parse: (value: string | number) => number) {
  return z.union([z.number(), z.string()]).transform((value, ctx) => {
    try {
      return parse(value);
    } catch (error) {
      ctx.addIssue({ code: 'custom', message: (error as Error).message });
      return z.NEVER;
    }
  });
}

/** Bytes: `4MiB`, `1.5GB` or a plain number. */
export const sizeField = () => unitField(parseSize);
/** Bytes per second: `100MB`, `800Mbit` or a plain number; 0 means unlimited. */
export const rateField = () => unitField(parseRate);
