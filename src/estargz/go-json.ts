/**
 * JSON text exactly as Go's encoding/json (Go 1.19, used by stargz-snapshotter 0.12) writes it
 * with MarshalIndent(v, "", "\t"), so a TOC we write hashes like one Go would write for the same
 * entries. Differences from JSON.stringify: '<', '>', '&', U+2028 and U+2029 are escaped, and
 * control characters other than \n \r \t use \u00XX (no \b or \f short forms).
 */
export function goQuote(text: string): string {
  let out = '"';
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i);
    let escape: string | undefined;
    if (code < 0x20) {
      escape = code === 0x0a ? '\\n' : code === 0x0d ? '\\r' : code === 0x09 ? '\\t' : `\\u00${hex2(code)}`;
    } else if (code === 0x22) escape = '\\"';
    else if (code === 0x5c) escape = '\\\\';
    else if (code === 0x3c || code === 0x3e || code === 0x26) escape = `\\u00${hex2(code)}`;
    else if (code === 0x2028 || code === 0x2029) escape = `\\u${code.toString(16)}`;
    else if (code >= 0xd800 && code <= 0xdfff) {
      // A lone surrogate cannot be UTF-8 encoded; Go would have written U+FFFD for invalid bytes.
      const isPair = code <= 0xdbff && i + 1 < text.length && (text.charCodeAt(i + 1) & 0xfc00) === 0xdc00;
      if (isPair) {
        i++;
        continue;
      }
      escape = '\\ufffd';
    }
    if (escape !== undefined) {
      out += text.slice(start, i) + escape;
      start = i + 1;
    }
  }
  return out + text.slice(start) + '"';
}

function hex2(code: number): string {
  return code.toString(16).padStart(2, '0');
}

/** A JSON value restricted to what a TOC holds; object keys keep insertion order (Go struct order). */
export type GoJsonValue = string | number | GoJsonValue[] | { [key: string]: GoJsonValue } | null;

/** MarshalIndent(value, "", "\t"). Map-like objects must already have their keys sorted. */
export function goMarshalIndent(value: GoJsonValue, indent = ''): string {
  if (value === null) return 'null';
  if (typeof value === 'string') return goQuote(value);
  if (typeof value === 'number') {
    if (!Number.isSafeInteger(value)) throw new RangeError(`cannot encode ${value}: TOC numbers are integers`);
    return String(value);
  }
  const inner = `${indent}\t`;
  if (Array.isArray(value)) {
    if (value.length === 0) return '[]';
    return `[\n${value.map((item) => inner + goMarshalIndent(item, inner)).join(',\n')}\n${indent}]`;
  }
  const fields = Object.entries(value).map(([key, field]) => `${inner}${goQuote(key)}: ${goMarshalIndent(field, inner)}`);
  if (fields.length === 0) return '{}';
  return `{\n${fields.join(',\n')}\n${indent}}`;
}

/**
 * Map entries in the order Go's encoding/json writes a map: by the keys' UTF-8 bytes (JS sort
 * compares UTF-16 units, which differs above U+FFFF).
 */
export function sortEntriesLikeGo<T>(entries: [string, T][]): [string, T][] {
  return entries.sort(([a], [b]) => Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8')));
}
