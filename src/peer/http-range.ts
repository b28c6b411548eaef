/** HTTP Range requests (RFC 9110, section 14) over a representation of known size. */

export interface ByteRange {
  /** First byte, inclusive. */
  start: number;
  /** Last byte, inclusive. */
  end: number;
}

export type RangeRequest =
  | { kind: 'none' }
  | { kind: 'ranges'; ranges: ByteRange[] }
  | { kind: 'unsatisfiable'; reason?: string }
  | { kind: 'invalid'; reason: string };

/** More ranges than this in one request is refused: a cheap way to make a server do much work. */
export const MAX_RANGES = 64;

export function parseRange(header: string | undefined, size: number): RangeRequest {
  if (header === undefined) return { kind: 'none' };
  const [, unit, rangeSet] = /^\s*([A-Za-z]+)\s*=\s*(.*)$/.exec(header) ?? [];
  if (unit === undefined || rangeSet === undefined) return { kind: 'invalid', reason: `malformed Range header "${header}"` };
  if (unit.toLowerCase() !== 'bytes') return { kind: 'invalid', reason: `unsupported range unit "${unit}"` };
  const specs = rangeSet.split(',').map((spec) => spec.trim());
  if (specs.length > MAX_RANGES) return { kind: 'invalid', reason: `more than ${MAX_RANGES} ranges in one request` };
  const ranges: ByteRange[] = [];
  for (const spec of specs) {
    const parts = /^(\d*)-(\d*)$/.exec(spec);
    if (!parts || (parts[1] === '' && parts[2] === '')) return { kind: 'invalid', reason: `malformed byte range "${spec}"` };
    if (parts[1] === '') {
      // Suffix range: the last N bytes.
      const length = Number(parts[2]);
      if (length === 0 || size === 0) continue;
      ranges.push({ start: Math.max(0, size - length), end: size - 1 });
      continue;
    }
    const start = Number(parts[1]);
    const end = parts[2] === '' ? size - 1 : Number(parts[2]);
    if (!Number.isSafeInteger(start) || !Number.isSafeInteger(end)) return { kind: 'invalid', reason: `byte range "${spec}" is too large` };
    if (parts[2] !== '' && end < start) return { kind: 'invalid', reason: `byte range "${spec}" ends before it starts` };
    if (start >= size) continue; // unsatisfiable on its own; others may still be served
    ranges.push({ start, end: Math.min(end, size - 1) });
  }
  if (!ranges.length) return { kind: 'unsatisfiable' };
  // Overlapping ranges would make the server send bytes many times over for one request
  // (64 copies of "0-" is 64 copies of the blob): what a client may ask for is the blob, once.
  const total = ranges.reduce((sum, range) => sum + (range.end - range.start + 1), 0);
  if (ranges.length > 1 && total > size) {
    return { kind: 'unsatisfiable', reason: `the ranges ask for ${total} bytes in all, more than the blob's ${size}` };
  }
  return { kind: 'ranges', ranges };
}

export function contentRange(range: ByteRange, size: number): string {
  return `bytes ${range.start}-${range.end}/${size}`;
}

/** The framing of a multipart/byteranges body, so its length is known before any byte is sent. */
export function multipartLayout(
  ranges: ByteRange[],
  size: number,
  contentType: string,
  boundary: string,
): { parts: Array<{ head: string; range: ByteRange }>; tail: string; length: number } {
  const parts = ranges.map((range, i) => ({
    head: `${i === 0 ? '' : '\r\n'}--${boundary}\r\nContent-Type: ${contentType}\r\nContent-Range: ${contentRange(range, size)}\r\n\r\n`,
    range,
  }));
  const tail = `\r\n--${boundary}--\r\n`;
  const length =
    parts.reduce((sum, part) => sum + Buffer.byteLength(part.head) + (part.range.end - part.range.start + 1), 0) + Buffer.byteLength(tail);
  return { parts, tail, length };
}
