// Edits a TOML document as text, so that everything the edit does not touch (comments, order,
// indentation, quoting) stays byte for byte as the node's owner wrote it. smol-toml parses the
// document before and after every edit; an edit that would change anything but the keys it sets
// is refused, never written.

import { parse, TomlError } from 'smol-toml';
import { isDeepStrictEqual } from 'node:util';
import { itemAt } from '../common/indexing.js';

export type TomlValue = string | boolean | number;
type TomlTable = Record<string, unknown>;

/** A document that is not valid TOML, or an edit this module cannot make safely. */
export class TomlEditError extends Error {
  override name = 'TomlEditError';
}

/** Parses `text`, naming the line and column of the first error. */
export function parseToml(text: string, what: string): TomlTable {
  try {
    return parse(text);
  } catch (error) {
    if (error instanceof TomlError)
      throw new TomlEditError(`${what} is not valid TOML (line ${error.line}, column ${error.column}): ${firstLine(error.message)}`);
    throw error;
  }
}

function firstLine(message: string): string {
  return message.split('\n')[0] ?? message;
}

/** The value at `path` in a parsed document, or undefined. */
export function valueAt(doc: TomlTable, path: readonly string[]): unknown {
  let node: unknown = doc;
  for (const key of path) {
    if (node === null || typeof node !== 'object' || Array.isArray(node)) return undefined;
    node = (node as TomlTable)[key];
  }
  return node;
}

/** `plugins."io.containerd.grpc.v1.cri".registry`: bare keys stay bare, others are quoted. */
export function formatKeyPath(path: readonly string[]): string {
  return path.map((key) => (/^[A-Za-z0-9_-]+$/.test(key) ? key : JSON.stringify(key))).join('.');
}

function formatValue(value: TomlValue): string {
  // A JSON string is a TOML basic string for every character a path or URL holds.
  return typeof value === 'string' ? JSON.stringify(value) : String(value);
}

// ---------------------------------------------------------------- a statement scanner

interface Statement {
  kind: 'table' | 'array-table' | 'keyval';
  /** The absolute key path: a header's own path, or a key's table path plus its dotted key. */
  path: string[];
  /** Offsets of the whole statement, from its first character to the end of its line. */
  start: number;
  end: number;
  /** For a keyval: the value's offsets. */
  valueStart: number;
  valueEnd: number;
  /** The whitespace before the statement on its line. */
  indent: string;
}

/**
 * Splits a valid TOML document into headers and key/value statements with their offsets. It
 * follows strings, arrays and inline tables over several lines, so that a `[` inside a value is
 * never taken for a header. Validity itself is smol-toml's job.
 */
function scan(text: string): Statement[] {
  const statements: Statement[] = [];
  let table: string[] = [];
  let i = 0;
  const n = text.length;

  const skipBlank = () => {
    for (;;) {
      while (i < n && ' \t\r\n'.includes(text.charAt(i))) i++;
      if (text[i] === '#') {
        while (i < n && text[i] !== '\n') i++;
        continue;
      }
      return;
    }
  };
  const skipSpaces = () => {
    while (i < n && (text[i] === ' ' || text[i] === '\t')) i++;
  };
  const toLineEnd = () => {
    while (i < n && text[i] !== '\n') i++;
    if (i < n) i++;
  };
  const readKey = (): string[] => {
    const keys: string[] = [];
    for (;;) {
      skipSpaces();
      keys.push(readSimpleKey());
      skipSpaces();
      if (text[i] !== '.') return keys;
      i++;
    }
  };
  const readSimpleKey = (): string => {
    const c = text[i];
    if (c === '"' || c === "'") {
      const from = i;
      skipString();
      const raw = text.slice(from, i);
      return c === '"' ? (JSON.parse(raw) as string) : raw.slice(1, -1);
    }
    const from = i;
    while (i < n && /[A-Za-z0-9_-]/.test(text.charAt(i))) i++;
    return text.slice(from, i);
  };
  const skipString = () => {
    const quote = text.charAt(i);
    if (text.startsWith(quote.repeat(3), i)) {
      i += 3;
      while (i < n && !text.startsWith(quote.repeat(3), i)) i += quote === '"' && text[i] === '\\' ? 2 : 1;
      i += 3;
      while (text[i] === quote) i++; // up to two quotes may end the content
      return;
    }
    i++;
    while (i < n && text[i] !== quote) i += quote === '"' && text[i] === '\\' ? 2 : 1;
    i++;
  };
  const skipValue = () => {
    let depth = 0;
    for (; i < n;) {
      const c = text.charAt(i);
      if (c === '"' || c === "'") skipString();
      else if (c === '[' || c === '{') {
        depth++;
        i++;
      } else if (c === ']' || c === '}') {
        depth--;
        i++;
        if (depth === 0) return;
      } else if (c === '#' && depth > 0) {
        while (i < n && text[i] !== '\n') i++;
      } else if ((c === '\n' || c === '#') && depth === 0) {
        return;
      } else i++;
    }
  };

  for (;;) {
    skipBlank();
    if (i >= n) break;
    const lineStart = text.lastIndexOf('\n', i - 1) + 1;
    const indent = text.slice(lineStart, i);
    const start = i;
    if (text[i] === '[') {
      const arrayTable = text[i + 1] === '[';
      i += arrayTable ? 2 : 1;
      table = readKey();
      toLineEnd();
      statements.push({ kind: arrayTable ? 'array-table' : 'table', path: table, start, end: i, valueStart: i, valueEnd: i, indent });
      continue;
    }
    const key = readKey();
    i++; // '='
    skipSpaces();
    const valueStart = i;
    skipValue();
    let valueEnd = i;
    while (valueEnd > valueStart && (text[valueEnd - 1] === ' ' || text[valueEnd - 1] === '\t' || text[valueEnd - 1] === '\r')) valueEnd--;
    toLineEnd();
    statements.push({ kind: 'keyval', path: [...table, ...key], start, end: i, valueStart, valueEnd, indent });
  }
  return statements;
}

// ---------------------------------------------------------------- edits

/** One key to set: the table that holds it and its value. */
export interface TomlSetting {
  table: readonly string[];
  key: string;
  value: TomlValue;
}

/**
 * A leading part of the text that must not change (k3s's `{{ template "base" . }}`, rendered):
 * keys and tables that live there cannot be edited, only new tables appended after it.
 */
export interface LockedPrefix {
  /** The first offset that may change. */
  end: number;
  /** Why it may not change, for the error that names a key found there. */
  reason: string;
}

/**
 * Sets each key to its value, changing only those keys' text: an existing key's value is
 * replaced in place; a missing key is added at the end of its table; a missing table is appended
 * at the end of the document. Throws TomlEditError when the result would not parse or would differ
 * from the original anywhere but at these keys (for example a key that lives in an inline table),
 * or when a key or its table lies in `locked`.
 */
export function setTomlValues(text: string, settings: readonly TomlSetting[], what: string, locked?: LockedPrefix): string {
  const before = parseToml(text, what);
  let out = text;
  for (const setting of settings) out = setOne(out, setting, what, locked);
  let after: TomlTable;
  try {
    after = parse(out);
  } catch {
    throw new TomlEditError(`${what}: cannot set ${describe(settings)} without rewriting its structure; set it by hand`);
  }
  // Plain JSON on both sides: smol-toml's tables have no prototype, and dates compare as text.
  const expected = plain(before);
  for (const { table, key, value } of settings) assignAt(expected, [...table, key], value);
  if (!isDeepStrictEqual(plain(after), expected)) {
    throw new TomlEditError(`${what}: setting ${describe(settings)} as text would change other keys; set it by hand`);
  }
  return out;
}

function plain(doc: TomlTable): TomlTable {
  return JSON.parse(JSON.stringify(doc)) as TomlTable;
}

function describe(settings: readonly TomlSetting[]): string {
  return settings.map((s) => formatKeyPath([...s.table, s.key])).join(', ');
}

function assignAt(doc: TomlTable, path: readonly string[], value: TomlValue): void {
  let node = doc;
  for (const key of path.slice(0, -1)) {
    const next = node[key];
    if (next === undefined) node[key] = {};
    else if (next === null || typeof next !== 'object' || Array.isArray(next)) {
      throw new TomlEditError(`${formatKeyPath(path)}: ${key} is not a table`);
    }
    node = node[key] as TomlTable;
  }
  node[itemAt(path, path.length - 1)] = value;
}

function setOne(text: string, { table, key, value }: TomlSetting, what: string, locked: LockedPrefix | undefined): string {
  const statements = scan(text);
  const full = [...table, key];
  const rendered = formatValue(value);
  const refuseIfLocked = (offset: number, where: string) => {
    if (locked && offset < locked.end) throw new TomlEditError(`${what}: cannot set ${formatKeyPath(full)} (${where}): ${locked.reason}`);
  };
  const existing = statements.find((s) => s.kind === 'keyval' && isDeepStrictEqual(s.path, full));
  if (existing) {
    if (text.slice(existing.valueStart, existing.valueEnd) === rendered) return text;
    refuseIfLocked(existing.valueStart, `it is ${text.slice(existing.valueStart, existing.valueEnd)} there`);
    return text.slice(0, existing.valueStart) + rendered + text.slice(existing.valueEnd);
  }
  const headerIndex = statements.findIndex((s) => s.kind === 'table' && isDeepStrictEqual(s.path, table));
  const eol = text.includes('\r\n') ? '\r\n' : '\n';
  if (headerIndex >= 0) {
    const header = itemAt(statements, headerIndex);
    refuseIfLocked(header.start, `its table [${formatKeyPath(table)}] is defined there`);
    // The table's own statements run until the next header.
    let last = header;
    let indent: string | undefined;
    for (const s of statements.slice(headerIndex + 1)) {
      if (s.kind !== 'keyval') break;
      last = s;
      indent ??= s.indent;
    }
    const line = `${indent ?? header.indent + '  '}${formatKeyPath([key])} = ${rendered}${eol}`;
    const at = last.end;
    const needsBreak = at > 0 && text[at - 1] !== '\n';
    return text.slice(0, at) + (needsBreak ? eol : '') + line + text.slice(at);
  }
  if (table.length === 0) {
    // A top-level key must come before the first table.
    const firstTable = statements.find((s) => s.kind !== 'keyval');
    const at = firstTable ? firstTable.start - firstTable.indent.length : text.length;
    refuseIfLocked(at, 'a top-level key goes before the first table');
    const needsBreak = at > 0 && text[at - 1] !== '\n';
    return text.slice(0, at) + (needsBreak ? eol : '') + `${formatKeyPath([key])} = ${rendered}${eol}` + text.slice(at);
  }
  if (!text.trim()) return `[${formatKeyPath(table)}]${eol}  ${formatKeyPath([key])} = ${rendered}${eol}`;
  const separator = text.endsWith('\n') ? eol : eol + eol;
  return `${text}${separator}[${formatKeyPath(table)}]${eol}  ${formatKeyPath([key])} = ${rendered}${eol}`;
}

/**
 * Byte offset where the first table (`[…]` or `[[…]]`) begins, counting the comment lines right
 * above its header as its own; the text's length when it has no table.
 */
export function firstTableOffset(text: string): number {
  const first = scan(text).find((s) => s.kind !== 'keyval');
  if (!first) return text.length;
  let at = first.start - first.indent.length;
  for (;;) {
    const previousStart = text.lastIndexOf('\n', at - 2) + 1;
    if (at === 0 || !text.slice(previousStart, at).trimStart().startsWith('#')) return at;
    at = previousStart;
  }
}
