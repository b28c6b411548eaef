import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { setImmediate as nextTurn, setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, it } from 'node:test';
import type { BufferBody } from '../../src/oci/buffer-body.js';
import { directGet, DirectGetError } from '../../src/oci/direct-get.js';
import { DIRECT_BODY_MIN_BYTES, RegistryTransport } from '../../src/oci/transport.js';

async function listen(server: net.Server): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return (server.address() as AddressInfo).port;
}

/** Reads a whole body in fills of `step` bytes, checking each onFill report. */
async function readAll(body: BufferBody, size: number, step: number, onFill?: (filled: number) => void | Promise<void>): Promise<Buffer> {
  const out = Buffer.alloc(size);
  let at = 0;
  for (;;) {
    const length = Math.min(step, size - at);
    let last = 0;
    const n = await body.fill(out, at, length, (filled) => {
      assert.ok(filled > last && filled <= length, `onFill ${filled} after ${last}, of ${length}`);
      last = filled;
      return onFill?.(filled);
    });
    assert.equal(n, last, 'the fill resolves with what onFill last saw');
    at += n;
    if (n < length || at === size) break;
  }
  assert.equal(await body.fill(Buffer.alloc(1), 0, 1), 0, 'the body is over');
  return out.subarray(0, at);
}

describe("direct GET (plain HTTP/1.1 bodies read into the caller's buffers)", () => {
  const servers: Array<net.Server | Server> = [];
  afterEach(async () => {
    for (const server of servers.splice(0)) {
      (server as Server).closeAllConnections?.();
      await new Promise((resolve) => server.close(resolve));
    }
  });

  async function httpServer(handler: (req: IncomingMessage, res: ServerResponse) => void | Promise<void>): Promise<string> {
    const server = createServer((req, res) => {
      Promise.resolve()
        .then(() => handler(req, res))
        .catch(() => res.destroy()); // a handler that fails cuts its response short, which the test sees
    });
    servers.push(server);
    return `http://127.0.0.1:${await listen(server)}`;
  }

  /** A raw TCP server that answers every connection with `respond`. */
  async function rawServer(respond: (socket: net.Socket) => void): Promise<string> {
    const server = net.createServer((socket) => {
      socket.on('error', () => undefined);
      socket.once('data', () => respond(socket));
    });
    servers.push(server);
    return `http://127.0.0.1:${await listen(server)}`;
  }

  it('reads a body written in uneven pieces byte-exact, in fills of any size, and sends the request headers', async () => {
    const data = randomBytes(5 * 1024 * 1024 + 333);
    let seenHeaders: IncomingMessage['headers'] = {};
    const base = await httpServer(async (req, res) => {
      seenHeaders = req.headers;
      res.writeHead(200, { 'content-length': data.length, 'docker-content-digest': 'sha256:x' });
      for (let at = 0; at < data.length;) {
        const step = 1 + Math.floor(Math.random() * 300_000);
        res.write(data.subarray(at, at + step));
        at += step;
        if (Math.random() < 0.2) await sleep(2);
      }
      res.end();
    });
    for (const step of [4 * 1024 * 1024, 65_536, 1_000_003]) {
      const response = await directGet(new URL(`${base}/v2/x/blobs/y?ns=z`), { authorization: 'Bearer t', accept: '*/*' });
      assert.ok(response);
      assert.equal(response.statusCode, 200);
      assert.equal(response.headers['docker-content-digest'], 'sha256:x');
      assert.ok((await readAll(response.body, data.length, step)).equals(data), `fills of ${step}`);
    }
    assert.equal(seenHeaders.authorization, 'Bearer t');
    assert.equal(seenHeaders.connection, 'close');
  });

  it('holds reads while onFill waits (a rate limiter) and still delivers every byte', async () => {
    const data = randomBytes(3 * 1024 * 1024);
    const base = await httpServer((_req, res) => void res.end(data));
    const response = await directGet(new URL(`${base}/blob`), {});
    assert.ok(response, 'an answer with a Content-Length');
    let waits = 0;
    const body = await readAll(response.body, data.length, 1024 * 1024, async () => {
      waits++;
      await sleep(1);
    });
    assert.ok(body.equals(data));
    assert.ok(waits >= 3);

    // Small fills, served from bytes read ahead as well as from the socket: none may end
    // before the wait its last onFill asked for. The wait is one turn of the event loop (3,146 of
    // them; a 1 ms timer each made this test take 4 s).
    const again = await directGet(new URL(`${base}/blob`), {});
    assert.ok(again, 'an answer with a Content-Length');
    let waiting = false;
    const out = Buffer.alloc(data.length);
    for (let at = 0; at < data.length;) {
      const n = await again.body.fill(out, at, 1000, async () => {
        waiting = true;
        await nextTurn();
        waiting = false;
      });
      assert.ok(!waiting, 'a fill ended while its onFill was still waiting');
      at += n;
    }
    assert.ok(out.equals(data));
  });

  it('answers without a Content-Length resolve undefined, and the transport asks again through undici', async () => {
    const data = randomBytes(DIRECT_BODY_MIN_BYTES + 5);
    let requests = 0;
    const base = await httpServer((_req, res) => {
      requests++;
      res.writeHead(200); // chunked
      res.write(data.subarray(0, 1000));
      res.end(data.subarray(1000));
    });
    assert.equal(await directGet(new URL(`${base}/blob`), {}), undefined);
    const transport = new RegistryTransport();
    try {
      const response = await transport.sendForBuffers(new URL(`${base}/blob`), { expectedBytes: data.length });
      assert.ok((await readAll(response.body, data.length, 4 * 1024 * 1024)).equals(data));
      assert.equal(requests, 3);
    } finally {
      await transport.close();
    }
  });

  it('follows a redirect to another origin without the credentials, and reads the body there', async () => {
    const data = randomBytes(DIRECT_BODY_MIN_BYTES);
    let storageAuthorization: string | undefined = 'unset';
    const storage = await httpServer((req, res) => {
      storageAuthorization = req.headers.authorization;
      res.writeHead(200, { 'content-length': data.length });
      res.end(data);
    });
    const registry = await httpServer((req, res) => {
      assert.equal(req.headers.authorization, 'Bearer secret');
      res.writeHead(307, { location: `${storage}/signed?sig=1`, 'content-length': 5 });
      res.end('moved');
    });
    const transport = new RegistryTransport();
    try {
      const response = await transport.sendForBuffers(new URL(`${registry}/v2/x/blobs/y`), {
        headers: { authorization: 'Bearer secret' },
        expectedBytes: data.length,
      });
      assert.equal(response.url.href, `${storage}/signed?sig=1`);
      assert.ok((await readAll(response.body, data.length, 4 * 1024 * 1024)).equals(data));
      assert.equal(storageAuthorization, undefined);
    } finally {
      await transport.close();
    }
  });

  it('reads an error body as text', async () => {
    const base = await httpServer((_req, res) => {
      const text = '{"errors":[{"code":"UNAUTHORIZED"}]}';
      res.writeHead(401, { 'www-authenticate': 'Bearer realm="x"', 'content-type': 'application/json', 'content-length': text.length });
      res.end(text);
    });
    const response = await directGet(new URL(`${base}/blob`), {});
    assert.ok(response, 'an answer with a Content-Length');
    assert.equal(response.statusCode, 401);
    assert.equal(response.headers['www-authenticate'], 'Bearer realm="x"');
    assert.equal(await response.body.text(), '{"errors":[{"code":"UNAUTHORIZED"}]}');
  });

  it('names a body cut short, a body longer than announced, and a malformed head', async () => {
    const cut = await rawServer((socket) => {
      socket.write('HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n');
      socket.end(Buffer.alloc(40_000));
    });
    const response = await directGet(new URL(`${cut}/blob`), {});
    assert.ok(response, 'an answer with a Content-Length');
    await assert.rejects(
      readAll(response.body, 100_000, 100_000),
      (error: Error) => error instanceof DirectGetError && /60000 body bytes still to come/.test(error.message),
    );

    const long = await rawServer((socket) => socket.end('HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabcdef'));
    await assert.rejects(directGet(new URL(`${long}/blob`), {}), /more than its Content-Length/);

    const garbage = await rawServer((socket) => socket.end('SSH-2.0-OpenSSH\r\n\r\n'));
    await assert.rejects(directGet(new URL(`${garbage}/blob`), {}), /sent no HTTP\/1.x status line/);

    const silent = await rawServer((socket) => socket.end());
    await assert.rejects(directGet(new URL(`${silent}/blob`), {}), /closed before a response/);
  });

  it('refuses a header that would inject a line, and anything but plain HTTP', async () => {
    await assert.rejects(
      directGet(new URL('http://127.0.0.1:9/x'), { authorization: 'Bearer a\r\nx-evil: 1' }),
      /invalid request header "authorization"/,
    );
    await assert.rejects(directGet(new URL('https://127.0.0.1:9/x'), {}), /plain HTTP only/);
  });

  it('stops when its signal aborts, mid-body', async () => {
    const base = await httpServer((_req, res) => {
      res.writeHead(200, { 'content-length': 10_000_000 });
      res.write(Buffer.alloc(1000)); // and nothing more
    });
    const controller = new AbortController();
    const response = await directGet(new URL(`${base}/blob`), {}, controller.signal);
    assert.ok(response, 'an answer with a Content-Length');
    const reading = response.body.fill(Buffer.alloc(10_000_000), 0, 10_000_000);
    setTimeout(() => controller.abort(new Error('client went away')), 50);
    await assert.rejects(reading, /client went away/);
  });
});
