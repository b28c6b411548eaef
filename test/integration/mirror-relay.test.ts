// The mirror relays bytes from the origin to its clients as they arrive, before their piece is
// stored: a lazy mount's prefetch or a cold pull does not wait for whole 4 MiB pieces. A registry
// cannot be paused mid-body, so the origin here is a small server that stops sending at a chosen
// byte until the test lets it go on; the peer is the real process.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { createServer, request as rawRequest, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { startPeer, type RunningPeerProcess } from '../fixtures/peer.js';
import { waitFor } from '../fixtures/processes.js';

const MiB = 1024 * 1024;
const PIECE = 4 * MiB; // the peer's piece size for a blob of this size

interface PausingOrigin {
  host: string;
  /** Body bytes (counted from the blob's start) after which GETs stop until release(). */
  pauseAt: number;
  release(): void;
  close(): Promise<void>;
}

async function startPausingOrigin(data: Buffer, digest: string): Promise<PausingOrigin> {
  let released!: () => void;
  let gate = new Promise<void>((resolve) => (released = resolve));
  const origin: PausingOrigin = {
    host: '',
    pauseAt: Infinity,
    release: () => released(),
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    if (req.url !== `/v2/test/blob/blobs/${digest}`) return void res.writeHead(404).end();
    const match = /^bytes=(\d+)-(\d+)$/.exec(req.headers.range ?? '');
    const start = match ? Number(match[1]) : 0;
    const end = match ? Number(match[2]) : data.length - 1;
    const headers = { 'content-length': end - start + 1, 'docker-content-digest': digest };
    if (match) res.writeHead(206, { ...headers, 'content-range': `bytes ${start}-${end}/${data.length}` });
    else res.writeHead(200, headers);
    if (req.method === 'HEAD') return void res.end();
    const pause = Math.min(Math.max(origin.pauseAt, start), end + 1);
    res.write(data.subarray(start, pause));
    void gate.then(() => res.end(data.subarray(pause, end + 1)));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  origin.host = `127.0.0.1:${(server.address() as AddressInfo).port}`;
  // Each test pauses afresh.
  const release = origin.release.bind(origin);
  origin.release = () => {
    release();
    gate = new Promise<void>((resolve) => (released = resolve));
  };
  return origin;
}

/** A GET that counts body bytes as they come, so a test can look at them mid-transfer. */
function streamingGet(url: string, headers: Record<string, string> = {}) {
  const chunks: Buffer[] = [];
  const state = { status: 0, received: 0, body: () => Buffer.concat(chunks) };
  const done = new Promise<void>((resolve, reject) => {
    const req = rawRequest(url, { headers }, (res) => {
      state.status = res.statusCode ?? 0;
      res.on('data', (chunk: Buffer) => {
        chunks.push(chunk);
        state.received += chunk.length;
      });
      res.on('end', resolve);
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
  return { state, done };
}

describe('peer mirror: bytes relayed from the origin before their piece is stored', { timeout: 120_000 }, () => {
  const data = randomBytes(2 * PIECE + 3 * MiB);
  const digest = `sha256:${createHash('sha256').update(data).digest('hex')}`;
  let origin: PausingOrigin;
  let peer: RunningPeerProcess;

  before(async () => {
    origin = await startPausingOrigin(data, digest);
    peer = await startPeer({ insecure: [origin.host] });
  });
  after(async () => {
    origin?.release();
    await peer?.stop();
    await origin?.close();
  });

  const url = () => `${peer.url}/v2/test/blob/blobs/${digest}?ns=${origin.host}`;

  it('answers a range inside a piece that is still arriving', async () => {
    origin.pauseAt = 3 * MiB; // piece 0 stays incomplete
    const { state, done } = streamingGet(url(), { range: `bytes=${MiB}-${2 * MiB - 1}` });
    await done; // would hang until release() if the peer waited for the whole piece
    assert.equal(state.status, 206);
    assert.ok(state.body().equals(data.subarray(MiB, 2 * MiB)));
    origin.release();
  });

  it('streams a whole cold blob up to the origin, holding back only the last piece for verification', async () => {
    const fresh = await startPeer({ insecure: [origin.host] });
    try {
      origin.pauseAt = PIECE + 2 * MiB; // in the middle of piece 1
      const { state, done } = streamingGet(`${fresh.url}/v2/test/blob/blobs/${digest}?ns=${origin.host}`);
      // More than piece 0 arrives while piece 1 is incomplete (relayed in 256 KiB steps).
      await waitFor(() => state.received >= PIECE + MiB, 20_000, 'bytes of the growing piece 1');
      assert.ok(state.received <= PIECE + 2 * MiB);
      origin.pauseAt = Infinity;
      origin.release();
      await done;
      assert.equal(state.status, 200);
      assert.ok(state.body().equals(data));
    } finally {
      await fresh.stop();
    }
  });

  it('holds back the last piece of a whole blob until the blob is verified', async () => {
    const fresh = await startPeer({ insecure: [origin.host] });
    try {
      origin.pauseAt = 2 * PIECE + MiB; // inside the last piece
      const { state, done } = streamingGet(`${fresh.url}/v2/test/blob/blobs/${digest}?ns=${origin.host}`);
      await waitFor(() => state.received >= 2 * PIECE, 20_000, 'the first two pieces');
      await new Promise((resolve) => setTimeout(resolve, 300));
      assert.equal(state.received, 2 * PIECE, 'no byte of the unverified last piece');
      origin.pauseAt = Infinity;
      origin.release();
      await done;
      assert.ok(state.body().equals(data));
    } finally {
      await fresh.stop();
    }
  });
});
