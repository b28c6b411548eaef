import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { Agent } from 'undici';
import { silentLogger } from '../../src/common/log.js';
import { GrowingPiece } from '../../src/peer/growing-piece.js';
import { ParentBusyError, ParentLink, PieceMissingError } from '../../src/peer/swarm/parent-link.js';
import { SPAN_PATH } from '../../src/rpc/upload-api.js';

const TASK = `sha256:${'d'.repeat(64)}`;

describe('parent link: spans', () => {
  const piece = randomBytes(1_000_000);
  const asked: string[] = [];
  let server: Server;
  const dispatcher = new Agent();
  after(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
    await dispatcher.close();
  });

  /** A parent that sends a span in two halves 100 ms apart; piece 1 is busy, piece 2 missing. */
  before(async () => {
    server = createServer((req, res) => {
      asked.push(req.url ?? '');
      const [, , index, start, end] = SPAN_PATH.exec((req.url ?? '').split('?')[0] ?? '') ?? [];
      if (index === '1') return void res.writeHead(429, { 'content-length': 0 }).end();
      if (index !== '0') return void res.writeHead(404, { 'content-length': 0 }).end();
      const bytes = piece.subarray(Number(start), Number(end) + 1);
      res.writeHead(200, { 'content-length': bytes.length });
      res.write(bytes.subarray(0, bytes.length / 2));
      setTimeout(() => res.end(bytes.subarray(bytes.length / 2)), 100);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  });

  function parent(): ParentLink {
    const info = { peerId: 'p', hostId: 'h', ip: '127.0.0.1', uploadPort: (server.address() as AddressInfo).port, seed: true };
    return new ParentLink(
      info,
      TASK,
      4,
      dispatcher,
      {},
      undefined,
      silentLogger,
      () => undefined,
      () => undefined,
    );
  }

  it('reads a span into its buffer, and finishes it when the link is retired meanwhile (new parents arrived)', async () => {
    const link = parent();
    const into = new GrowingPiece(0, Buffer.alloc(200_000), () => undefined);
    const reading = link.fetchSpan(0, { start: 100_000, end: 299_999 }, 3, into, AbortSignal.timeout(5_000));
    await into.next(0); // the first half is in
    link.retire();
    await reading;
    assert.deepEqual(into.buffer, piece.subarray(100_000, 300_000));
    assert.equal(into.filled, 200_000);
    assert.ok(asked.includes(`/_starling/pieces/${TASK}/0/bytes/100000-299999?hops=3`), asked.join(' '));
  });

  it('says busy and missing as it does for pieces', async () => {
    const link = parent();
    const into = () => new GrowingPiece(0, Buffer.alloc(10), () => undefined);
    await assert.rejects(link.fetchSpan(1, { start: 0, end: 9 }, 0, into(), AbortSignal.timeout(5_000)), ParentBusyError);
    assert.ok(link.busyUntil > Date.now(), 'left alone a while');
    await assert.rejects(link.fetchSpan(2, { start: 0, end: 9 }, 0, into(), AbortSignal.timeout(5_000)), PieceMissingError);
    link.close();
  });
});
