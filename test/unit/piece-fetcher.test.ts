import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, it } from 'node:test';
import { PieceFetcher, PieceProtocolError, PieceTransferError, type PieceHead } from '../../src/peer/swarm/piece-fetcher.js';
import { itemAt } from '../../src/common/indexing.js';

/** A body target that records every `advance`. */
function target(length: number) {
  const advances: number[] = [];
  return { buffer: Buffer.alloc(length), advance: (filled: number) => void advances.push(filled), advances };
}

async function listen(server: net.Server): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return (server.address() as AddressInfo).port;
}

describe('piece fetcher (HTTP/1.1 straight into piece buffers)', () => {
  const servers: Array<net.Server | Server> = [];
  const fetchers: PieceFetcher[] = [];
  afterEach(async () => {
    for (const fetcher of fetchers.splice(0)) fetcher.close();
    for (const server of servers.splice(0)) {
      (server as Server).closeAllConnections?.();
      await new Promise((resolve) => server.close(resolve));
    }
  });

  /** An HTTP server whose handler the test picks; counts connections and remembers request heads. */
  async function httpServer(handler: Parameters<typeof createServer>[1]) {
    const seen = { connections: 0, authorizations: [] as Array<string | undefined> };
    const server = createServer((req, res) => {
      seen.authorizations.push(req.headers.authorization);
      handler?.(req, res);
    });
    server.on('connection', () => seen.connections++);
    servers.push(server);
    const port = await listen(server);
    return { port, seen, server };
  }

  it('reads a body that arrives in small, spaced writes whole, advancing as bytes land, over one kept-alive connection', async () => {
    const body = randomBytes(300_000);
    const { port, seen } = await httpServer((_req, res) => {
      res.writeHead(200, { 'content-length': body.length });
      let at = 0;
      const timer = setInterval(() => {
        res.write(body.subarray(at, (at += 20_000)));
        if (at >= body.length) {
          clearInterval(timer);
          res.end();
        }
      }, 2);
    });
    const fetcher = new PieceFetcher('127.0.0.1', port, 'authorization: Bearer sesame\r\n');
    fetchers.push(fetcher);
    for (let round = 0; round < 3; round++) {
      const into = target(body.length);
      const head = await fetcher.get('/piece', () => into, AbortSignal.timeout(10_000));
      assert.deepEqual(head, { status: 200, length: body.length });
      assert.ok(into.buffer.equals(body), 'the body arrives intact');
      assert.equal(into.advances.at(-1), body.length);
      assert.ok(
        into.advances.every((filled, i) => i === 0 || filled > itemAt(into.advances, i - 1)),
        'advances only grow',
      );
    }
    assert.equal(seen.connections, 1, 'the connection is kept alive and reused');
    assert.deepEqual(seen.authorizations, ['Bearer sesame', 'Bearer sesame', 'Bearer sesame']);
  });

  it('reads and drops the body of a busy or missing answer, takes no buffer for it, and keeps the connection', async () => {
    let calls = 0;
    const { port, seen } = await httpServer((_req, res) => {
      const status = ++calls === 1 ? 429 : calls === 2 ? 404 : 200;
      const text = status === 200 ? 'abcd' : JSON.stringify({ error: 'x'.repeat(20_000) });
      res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
      res.end(text);
    });
    const fetcher = new PieceFetcher('127.0.0.1', port);
    fetchers.push(fetcher);
    const heads: PieceHead[] = [];
    let buffersTaken = 0;
    for (let i = 0; i < 3; i++) {
      const into = target(4);
      heads.push(await fetcher.get('/p', (head) => (head.status === 200 ? (buffersTaken++, into) : undefined), AbortSignal.timeout(5_000)));
      if (i === 2) assert.equal(into.buffer.toString(), 'abcd');
    }
    assert.deepEqual(
      heads.map((h) => h.status),
      [429, 404, 200],
    );
    assert.equal(buffersTaken, 1);
    assert.equal(seen.connections, 1);
  });

  it('reports a body cut short as a transfer error that says the parent had answered', async () => {
    const { port } = await httpServer((_req, res) => {
      res.writeHead(200, { 'content-length': 100_000 });
      res.write(Buffer.alloc(30_000));
      setTimeout(() => res.destroy(), 20);
    });
    const fetcher = new PieceFetcher('127.0.0.1', port);
    fetchers.push(fetcher);
    const into = target(100_000);
    await assert.rejects(
      fetcher.get('/p', () => into, AbortSignal.timeout(5_000)),
      (error: unknown) => {
        assert.ok(error instanceof PieceTransferError);
        assert.equal(error.answered, true);
        assert.equal(error.received, 30_000);
        return true;
      },
    );
  });

  it('opens a fresh connection when the server closed a kept-alive one while idle', async () => {
    const { port, seen } = await httpServer((req, res) => {
      res.writeHead(200, { 'content-length': 2 });
      res.end('ok');
      // Hangs up soon after, without having said "connection: close" (an idle timeout).
      res.on('finish', () => setTimeout(() => req.socket.destroy(), 20));
    });
    const fetcher = new PieceFetcher('127.0.0.1', port);
    fetchers.push(fetcher);
    await fetcher.get('/p', () => target(2), AbortSignal.timeout(5_000));
    await sleep(200); // the server drops the idle connection
    const into = target(2);
    await fetcher.get('/p', () => into, AbortSignal.timeout(5_000));
    assert.equal(into.buffer.toString(), 'ok');
    assert.equal(seen.connections, 2);
  });

  it('retries once on a fresh connection when a kept-alive one breaks before any answer', async () => {
    const requestsOn = new WeakMap<object, number>();
    const { port, seen } = await httpServer((req, res) => {
      const count = (requestsOn.get(req.socket) ?? 0) + 1;
      requestsOn.set(req.socket, count);
      // A second request on a connection finds it closing (the race with an idle timeout).
      if (count > 1) return void req.socket.destroy();
      res.writeHead(200, { 'content-length': 2 });
      res.end('ok');
    });
    const fetcher = new PieceFetcher('127.0.0.1', port);
    fetchers.push(fetcher);
    await fetcher.get('/p', () => target(2), AbortSignal.timeout(5_000));
    const into = target(2);
    await fetcher.get('/p', () => into, AbortSignal.timeout(5_000));
    assert.equal(into.buffer.toString(), 'ok');
    assert.equal(seen.connections, 2);
  });

  it('drops the connection when aborted mid-body and rejects with the reason', async () => {
    const { port } = await httpServer((_req, res) => {
      res.writeHead(200, { 'content-length': 1_000_000 });
      res.write(Buffer.alloc(1000)); // and then nothing more
    });
    const fetcher = new PieceFetcher('127.0.0.1', port);
    fetchers.push(fetcher);
    const controller = new AbortController();
    const pending = fetcher.get('/p', () => target(1_000_000), controller.signal);
    await sleep(100);
    controller.abort(new Error('piece timeout'));
    await assert.rejects(pending, /piece timeout/);
  });

  it('refuses answers that are not well-formed piece responses, naming the problem', async () => {
    const answers: Record<string, string> = {
      '/chunked': 'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n',
      '/nolength': 'HTTP/1.1 200 OK\r\nconnection: keep-alive\r\n\r\n',
      '/garbage': 'SSH-2.0-OpenSSH\r\n\r\n',
      '/wronglength': 'HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabc',
      '/toolong': `HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}{}{}`,
      '/hugehead': `HTTP/1.1 200 OK\r\nx-pad: ${'p'.repeat(10_000)}\r\n\r\n`,
    };
    const server = net.createServer((socket) => {
      socket.on('error', () => undefined); // the fetcher hangs up on bad answers
      socket.once('data', (request) => {
        const path = request.toString('latin1').split(' ')[1] ?? '';
        socket.end(answers[path] ?? ''); // a path not listed gets a bare hang-up
      });
    });
    servers.push(server);
    const port = await listen(server);
    const expected: Record<string, RegExp> = {
      '/chunked': /sent a chunked body, where a Content-Length was needed/,
      '/nolength': /sent no Content-Length/,
      '/garbage': /sent no HTTP\/1.x status line/,
      '/wronglength': /sent 3 bytes where 4 were expected/,
      '/toolong': /more than its Content-Length/,
      '/hugehead': /response head over 8192 bytes/,
    };
    for (const [path, message] of Object.entries(expected)) {
      const fetcher = new PieceFetcher('127.0.0.1', port);
      fetchers.push(fetcher);
      await assert.rejects(
        fetcher.get(path, () => target(4), AbortSignal.timeout(5_000)),
        (error: unknown) => {
          assert.ok(error instanceof PieceProtocolError, `${path}: ${String(error)}`);
          assert.match(error.message, message, path);
          return true;
        },
      );
    }
  });

  it('fails with a transfer error when nothing listens', async () => {
    const probe = net.createServer();
    const port = await listen(probe);
    await new Promise((resolve) => probe.close(resolve));
    const fetcher = new PieceFetcher('127.0.0.1', port);
    fetchers.push(fetcher);
    await assert.rejects(
      fetcher.get('/p', () => target(1), AbortSignal.timeout(5_000)),
      (error: unknown) => {
        assert.ok(error instanceof PieceTransferError);
        assert.equal(error.answered, false);
        return true;
      },
    );
  });
});
