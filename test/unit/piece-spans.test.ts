import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { GrowingPiece } from '../../src/peer/growing-piece.js';
import { arrivingBytes, PieceSpans, type SpanView } from '../../src/peer/piece-spans.js';

const BLOB = `sha256:${'a'.repeat(64)}`;
const OTHER = `sha256:${'b'.repeat(64)}`;

/** A fetch the test fills by hand: `fill(n)` lands the next n bytes (byte i of the piece is i % 251). */
function manualFetch(start: number) {
  let into: GrowingPiece | undefined;
  let settle!: (error?: Error) => void;
  const calls: number[] = [];
  const fetch = (bytes: GrowingPiece) => {
    into = bytes;
    calls.push(bytes.buffer.length);
    return new Promise<void>((resolve, reject) => (settle = (error) => (error ? reject(error) : resolve())));
  };
  return {
    fetch,
    calls,
    fill(n: number) {
      const target = into as GrowingPiece;
      for (let i = 0; i < n; i++) target.buffer[target.filled + i] = (start + target.filled + i) % 251;
      target.advance(target.filled + n);
    },
    end: (error?: Error) => settle(error),
  };
}

async function collect(view: SpanView, length: number, chunk = 4): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const part of arrivingBytes(view.bytes, view.offset, view.offset + length - 1, chunk)) parts.push(Buffer.from(part));
  return Buffer.concat(parts);
}

const expected = (start: number, end: number) => Buffer.from(Array.from({ length: end - start + 1 }, (_, i) => (start + i) % 251));
const tick = () => new Promise((resolve) => setImmediate(resolve));

describe('piece spans', () => {
  it('fetches a span once however many ask, and serves a span inside it from the same bytes as they arrive', async () => {
    const spans = new PieceSpans();
    const fetch = manualFetch(100);
    const first = spans.open(BLOB, 2, { start: 100, end: 199 }, fetch.fetch);
    const again = spans.open(BLOB, 2, { start: 100, end: 199 }, fetch.fetch);
    const inside = spans.open(BLOB, 2, { start: 150, end: 159 }, fetch.fetch);
    assert.deepEqual(fetch.calls, [100], 'one fetch');
    assert.equal(inside.offset, 50);
    const reading = collect(inside, 10);
    fetch.fill(60);
    assert.deepEqual(await reading, expected(150, 159), 'the inner span is there before the fetch ends');
    fetch.fill(40);
    fetch.end();
    assert.deepEqual(await collect(first, 100), expected(100, 199));
    assert.deepEqual(await collect(again, 100, 1000), expected(100, 199));
    assert.equal(spans.bytes, 100);
    assert.equal(spans.find(BLOB, 3, { start: 100, end: 120 }), undefined, 'another piece');
    assert.equal(spans.find(BLOB, 2, { start: 90, end: 120 }), undefined, 'a span reaching outside it');
    assert.equal(spans.find(OTHER, 2, { start: 100, end: 120 }), undefined, 'another blob');
  });

  it('keeps nothing of a fetch that fails or ends short, and its readers hear of it', async () => {
    const spans = new PieceSpans();
    const broken = manualFetch(0);
    const view = spans.open(BLOB, 0, { start: 0, end: 99 }, broken.fetch);
    const reading = collect(view, 100);
    broken.fill(30);
    broken.end(new Error('parent went away'));
    await assert.rejects(reading, /ended after 30 of 100 bytes/);
    assert.equal(spans.find(BLOB, 0, { start: 0, end: 9 }), undefined, 'the bytes that came are not kept');
    assert.equal(spans.bytes, 0);

    const short = manualFetch(0);
    const next = spans.open(BLOB, 0, { start: 0, end: 99 }, short.fetch);
    assert.deepEqual(short.calls, [100], 'asked anew');
    short.fill(99);
    short.end(); // resolved without its last byte
    await assert.rejects(collect(next, 100), /ended after 99/);
    await tick();
    assert.equal(spans.bytes, 0);
  });

  it('evicts the least recently used complete spans beyond its bound, and forgets a piece or a blob', async () => {
    const spans = new PieceSpans(250);
    const done = async (digest: string, index: number) => {
      const fetch = manualFetch(0);
      spans.open(digest, index, { start: 0, end: 99 }, fetch.fetch);
      fetch.fill(100);
      fetch.end();
      await tick();
    };
    await done(BLOB, 0);
    await done(BLOB, 1);
    assert.ok(spans.find(BLOB, 0, { start: 0, end: 9 }), 'piece 0 used again');
    await done(BLOB, 2);
    assert.equal(spans.bytes, 200);
    assert.equal(spans.find(BLOB, 1, { start: 0, end: 9 }), undefined, 'piece 1, least recently used, went');
    assert.ok(spans.find(BLOB, 0, { start: 0, end: 9 }));
    await done(OTHER, 0);
    spans.forget(BLOB, 0);
    assert.equal(spans.find(BLOB, 0, { start: 0, end: 9 }), undefined, 'stored whole now');
    spans.forget(BLOB);
    assert.equal(spans.find(BLOB, 2, { start: 0, end: 9 }), undefined);
    assert.ok(spans.find(OTHER, 0, { start: 0, end: 9 }), "another blob's spans stay");
    assert.equal(spans.bytes, 100);
  });
});
