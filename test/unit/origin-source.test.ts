import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { silentLogger } from '../../src/common/log.js';
import { RateLimiter } from '../../src/common/rate-limiter.js';
import { RegistryTransport } from '../../src/oci/transport.js';
import { GrowingPiece } from '../../src/peer/growing-piece.js';
import type { KeptSpan } from '../../src/peer/piece-spans.js';
import { OriginSource } from '../../src/peer/sources/origin-source.js';
import { pieceLayout } from '../../src/storage/piece-plan.js';

const SIZE = 4500;
const PIECE = 1000;

describe('origin source: ranges and pieces filled around kept bytes', () => {
  const blob = randomBytes(SIZE);
  const asked: string[] = [];
  let server: Server;
  let url: URL;
  const transport = new RegistryTransport();
  /** A registry that answers Range requests exactly, and one range it answers with the whole blob. */
  before(async () => {
    server = createServer((req, res) => {
      const range = /^bytes=(\d+)-(\d+)$/.exec(String(req.headers.range ?? ''));
      asked.push(range ? `${range[1]}-${range[2]}` : 'whole');
      if (!range || req.url?.includes('ignores-range')) {
        res.writeHead(200, { 'content-length': SIZE });
        return void res.end(blob);
      }
      const [start, end] = [Number(range[1]), Number(range[2])];
      res.writeHead(206, { 'content-length': end - start + 1, 'content-range': `bytes ${start}-${end}/${SIZE}` });
      res.end(blob.subarray(start, end + 1));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = new URL(`http://127.0.0.1:${(server.address() as AddressInfo).port}/v2/x/blobs/sha256:${'c'.repeat(64)}`);
  });
  after(async () => {
    await transport.close();
    await new Promise((resolve) => server.close(resolve));
  });

  const source = (kept?: (index: number) => KeptSpan[], at = url) =>
    new OriginSource(at, {}, transport, new RateLimiter(0), silentLogger, undefined, kept);

  it('reads a range into a buffer as it arrives, and refuses an origin that ignores Range', async () => {
    asked.length = 0;
    const into = new GrowingPiece(0, Buffer.alloc(300), () => undefined);
    await source().readRange(1200, 1499, into);
    assert.deepEqual(into.buffer, blob.subarray(1200, 1500));
    assert.equal(into.filled, 300);
    const ignoring = source(undefined, new URL(`${url.href}?ignores-range`));
    await assert.rejects(
      ignoring.readRange(0, 9, new GrowingPiece(0, Buffer.alloc(10), () => undefined)),
      /answered bytes 0-9 .* with 200/,
    );
  });

  it('reads pieces with kept bytes around them, and the others in runs: the registry sends each byte once', async () => {
    asked.length = 0;
    const kept = (index: number): KeptSpan[] => {
      const span = (start: number, end: number) => ({
        start,
        bytes: Buffer.from(blob.subarray(index * PIECE + start, index * PIECE + end + 1)),
      });
      if (index === 1) return [span(150, 349), span(100, 199)]; // overlapping, out of order
      if (index === 3) return [span(950, 999)]; // the piece's end
      return [];
    };
    const pieces = new Map<number, Buffer>();
    await source(kept).fetchRun(pieceLayout(SIZE, PIECE), { first: 0, last: 4 }, async (index, bytes) => {
      pieces.set(index, Buffer.from(bytes));
    });
    for (let index = 0; index < 5; index++)
      assert.deepEqual(pieces.get(index), blob.subarray(index * PIECE, (index + 1) * PIECE), `piece ${index}`);
    assert.deepEqual(asked, ['0-999', '1000-1099', '1350-1999', '2000-2999', '3000-3949', '4000-4499']);
  });
});
