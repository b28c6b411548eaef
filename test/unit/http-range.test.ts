import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { contentRange, MAX_RANGES, multipartLayout, parseRange } from '../../src/peer/http-range.js';
import { itemAt } from '../../src/common/indexing.js';

describe('parseRange', () => {
  const size = 1000;
  it('has no range without a header', () => {
    assert.deepEqual(parseRange(undefined, size), { kind: 'none' });
  });
  it('parses single, open-ended and suffix ranges', () => {
    assert.deepEqual(parseRange('bytes=0-99', size), { kind: 'ranges', ranges: [{ start: 0, end: 99 }] });
    assert.deepEqual(parseRange('bytes=900-', size), { kind: 'ranges', ranges: [{ start: 900, end: 999 }] });
    assert.deepEqual(parseRange('bytes=-10', size), { kind: 'ranges', ranges: [{ start: 990, end: 999 }] });
    assert.deepEqual(parseRange('bytes=-5000', size), { kind: 'ranges', ranges: [{ start: 0, end: 999 }] });
  });
  it('clamps an end past the size', () => {
    assert.deepEqual(parseRange('bytes=990-5000', size), { kind: 'ranges', ranges: [{ start: 990, end: 999 }] });
  });
  it('parses several ranges and drops only the unsatisfiable ones', () => {
    assert.deepEqual(parseRange('bytes=0-0, 2000-3000, -1', size), {
      kind: 'ranges',
      ranges: [
        { start: 0, end: 0 },
        { start: 999, end: 999 },
      ],
    });
  });
  it('reports unsatisfiable ranges', () => {
    assert.equal(parseRange('bytes=1000-', size).kind, 'unsatisfiable');
    assert.equal(parseRange('bytes=-0', size).kind, 'unsatisfiable');
    assert.equal(parseRange('bytes=0-', 0).kind, 'unsatisfiable');
  });
  it('refuses several ranges that ask for more bytes in all than the blob holds (64 copies of "0-")', () => {
    const overlapping = parseRange(`bytes=${Array(64).fill('0-').join(',')}`, size);
    assert.deepEqual(overlapping, {
      kind: 'unsatisfiable',
      reason: `the ranges ask for ${64 * size} bytes in all, more than the blob's ${size}`,
    });
    assert.equal(parseRange('bytes=0-499,500-999', size).kind, 'ranges', 'the whole blob in two parts is fine');
    assert.equal(parseRange('bytes=0-', size).kind, 'ranges');
  });
  it('names what is malformed', () => {
    const cases: Array<[string, RegExp]> = [
      ['bytes=abc', /malformed byte range "abc"/],
      ['bytes=5-1', /ends before it starts/],
      ['items=0-1', /unsupported range unit "items"/],
      ['bytes 0-1', /malformed Range header/],
      ['bytes=-', /malformed byte range/],
      ['bytes=99999999999999999999-', /too large/],
      [`bytes=${Array.from({ length: MAX_RANGES + 1 }, (_, i) => `${i}-${i}`).join(',')}`, /more than 64 ranges/],
    ];
    for (const [header, reason] of cases) {
      const parsed = parseRange(header, size);
      assert.equal(parsed.kind, 'invalid', header);
      assert.match((parsed as { reason: string }).reason, reason);
    }
  });
});

describe('multipartLayout', () => {
  it('computes the exact body length of a multipart/byteranges answer', () => {
    const ranges = [
      { start: 0, end: 9 },
      { start: 50, end: 59 },
    ];
    const layout = multipartLayout(ranges, 100, 'application/octet-stream', 'B');
    const body = layout.parts.map((part) => part.head + 'x'.repeat(part.range.end - part.range.start + 1)).join('') + layout.tail;
    assert.equal(Buffer.byteLength(body), layout.length);
    assert.match(
      itemAt(layout.parts, 1).head,
      /^\r\n--B\r\nContent-Type: application\/octet-stream\r\nContent-Range: bytes 50-59\/100\r\n\r\n$/,
    );
    assert.equal(contentRange({ start: 50, end: 59 }, 100), 'bytes 50-59/100');
  });
});
