import assert from 'node:assert/strict';
import net, { type AddressInfo } from 'node:net';
import { after, describe, it } from 'node:test';
import { headEnd, Http1ResponseError, parseResponseHead } from '../../src/http1/response-head.js';
import { ResponseReader, type BodySink } from '../../src/http1/response-reader.js';
import { directGet } from '../../src/oci/direct-get.js';
import { PieceFetcher, PieceProtocolError } from '../../src/peer/swarm/piece-fetcher.js';

const head = (text: string) => parseResponseHead(text);

describe('HTTP/1.1 response heads, read strictly (RFC 9112)', () => {
  it('reads the status, the fields (names in lower case, repeats joined) and the framing', () => {
    const parsed = head('HTTP/1.1 200 OK\r\nContent-Length: 42\r\nX-A: 1\r\nx-a:  2 \r\nSet-Cookie: a=1\r\nset-cookie: b=2');
    assert.equal(parsed.status, 200);
    assert.equal(parsed.headers['x-a'], '1, 2');
    assert.deepEqual(parsed.headers['set-cookie'], ['a=1', 'b=2']);
    assert.deepEqual(parsed.framing, { kind: 'length', length: 42 });
    assert.equal(parsed.keepAlive, true);
    assert.equal(head('HTTP/1.1 404').status, 404); // no reason phrase
  });

  it('frames bodies as RFC 9112 §6.3 says', () => {
    assert.deepEqual(head('HTTP/1.1 204 No Content\r\ncontent-length: 10').framing, { kind: 'none' });
    assert.deepEqual(head('HTTP/1.1 304 Not Modified').framing, { kind: 'none' });
    assert.deepEqual(head('HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked').framing, { kind: 'chunked' });
    assert.deepEqual(head('HTTP/1.1 200 OK\r\ntransfer-encoding: gzip').framing, { kind: 'until-close' });
    assert.deepEqual(head('HTTP/1.1 200 OK').framing, { kind: 'until-close' });
    assert.deepEqual(head('HTTP/1.1 200 OK\r\ncontent-length: 7\r\ncontent-length: 7').framing, { kind: 'length', length: 7 });
    assert.deepEqual(head('HTTP/1.1 200 OK\r\ncontent-length: 7, 7').framing, { kind: 'length', length: 7 });
  });

  it("keeps the connection by the version's default and its Connection field", () => {
    assert.equal(head('HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0').keepAlive, false);
    assert.equal(head('HTTP/1.1 200 OK\r\nConnection: Keep-Alive, Close\r\ncontent-length: 0').keepAlive, false);
    assert.equal(head('HTTP/1.0 200 OK\r\ncontent-length: 0').keepAlive, false);
    assert.equal(head('HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0').keepAlive, true);
  });

  const malformed: Array<[string, string, RegExp]> = [
    ['no status line', 'SSH-2.0-OpenSSH', /no HTTP\/1\.x status line/],
    ['HTTP/2 on an HTTP/1.1 connection', 'HTTP/2 200', /no HTTP\/1\.x status line/],
    ['a status of two digits', 'HTTP/1.1 20 OK', /no HTTP\/1\.x status line/],
    ['a status glued to its reason', 'HTTP/1.1 200OK', /no HTTP\/1\.x status line/],
    ['obs-fold', 'HTTP/1.1 200 OK\r\nx-a: 1\r\n  continued\r\ncontent-length: 0', /folded header line \(obs-fold/],
    ['a header line without a colon', 'HTTP/1.1 200 OK\r\ncontent-length 5', /without a colon/],
    ['space before the colon', 'HTTP/1.1 200 OK\r\ncontent-length : 5', /name is not a token.*no space may precede the colon/],
    ['an empty field name', 'HTTP/1.1 200 OK\r\n: 5', /name is not a token/],
    ['a bare CR inside a line', 'HTTP/1.1 200 OK\r\nx-a: 1\rcontent-length: 5', /bare CR, LF or NUL/],
    ['a bare LF inside a line', 'HTTP/1.1 200 OK\r\nx-a: 1\ncontent-length: 5', /bare CR, LF or NUL/],
    ['a NUL in a value', 'HTTP/1.1 200 OK\r\nx-a: 1\0', /bare CR, LF or NUL/],
    ['a control character in a value', 'HTTP/1.1 200 OK\r\nx-a: 1\x07', /control character in header x-a/],
    ['differing Content-Length values', 'HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6', /differing Content-Length values/],
    ['a Content-Length list that differs', 'HTTP/1.1 200 OK\r\ncontent-length: 5, 6', /differing Content-Length values/],
    ['a Content-Length that is not digits', 'HTTP/1.1 200 OK\r\ncontent-length: 0x10', /invalid Content-Length/],
    ['a signed Content-Length', 'HTTP/1.1 200 OK\r\ncontent-length: +5', /invalid Content-Length/],
    ['an empty Content-Length', 'HTTP/1.1 200 OK\r\ncontent-length:', /invalid Content-Length/],
    ['a Content-Length past 2^53', 'HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999', /too large/],
    [
      'both Transfer-Encoding and Content-Length',
      'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5',
      /both Transfer-Encoding and Content-Length/,
    ],
  ];
  for (const [what, text, message] of malformed) {
    it(`refuses ${what}, naming it`, () => {
      assert.throws(
        () => head(text),
        (error: unknown) => error instanceof Http1ResponseError && message.test(error.message),
      );
    });
  }

  it('finds where a head ends, and refuses one whose lines end in a bare LF', () => {
    assert.equal(headEnd(Buffer.from('HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\nbody')), 34);
    assert.equal(headEnd(Buffer.from('HTTP/1.1 200 OK\r\ncontent-length: 0\r\n')), -1);
    assert.throws(() => headEnd(Buffer.from('HTTP/1.1 200 OK\ncontent-length: 0\n\n')), /bare LF/);
    // A head that could never end with CRLF CRLF is refused at its first bare LF, not when the limit or the close comes.
    assert.throws(() => headEnd(Buffer.from('HTTP/1.1 200 OK\r\ncontent-length: 0\n\r\n')), /bare LF/);
    assert.throws(() => headEnd(Buffer.from('HTTP/1.1 200 OK\nconte')), /bare LF/);
    assert.equal(headEnd(Buffer.from('HTTP/1.1 200 OK\r\n\r\na\nb')), 15); // a body may hold any bytes
  });
});

/** Feeds `chunks` to a reader as a socket would; returns what the reader made of them. */
function feed(chunks: Buffer[], limit = 1024, sinkLength?: number) {
  const seen: { head?: number; body: Buffer[]; ended: number; failure?: string } = { body: [], ended: 0 };
  const target = sinkLength === undefined ? undefined : Buffer.alloc(sinkLength);
  let filled = 0;
  const reader = new ResponseReader(limit, {
    head: (h): BodySink => {
      seen.head = h.status;
      return {
        into: () => target?.subarray(filled),
        landed: (n) => {
          filled += n;
          return true;
        },
        took: (bytes) => {
          seen.body.push(Buffer.from(bytes));
          return true;
        },
      };
    },
    end: () => seen.ended++,
    failed: (error) => (seen.failure = error.message),
  });
  reader.expect();
  for (const chunk of chunks) {
    let at = 0;
    while (at < chunk.length && !seen.failure) {
      const room = reader.buffer();
      const n = chunk.copy(room, 0, at, at + room.length);
      at += n;
      reader.read(n);
    }
  }
  if (target) seen.body.unshift(target.subarray(0, filled));
  return seen;
}

describe('the HTTP/1.1 response reader', () => {
  it('takes the head whichever way it is cut, and the body after it exactly', () => {
    const answer = Buffer.from('HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n0123456789');
    for (let cut = 1; cut < answer.length; cut++) {
      const seen = feed([answer.subarray(0, cut), answer.subarray(cut)]);
      assert.equal(seen.failure, undefined, `cut at ${cut}`);
      assert.equal(Buffer.concat(seen.body).toString(), '0123456789', `cut at ${cut}`);
      assert.equal(seen.ended, 1);
    }
  });

  it("reads a body into the caller's buffer, never past its Content-Length", () => {
    const seen = feed([Buffer.from('HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n'), Buffer.from('abcdEXTRA')], 1024, 8);
    assert.equal(Buffer.concat(seen.body).toString(), 'abcd');
    assert.equal(seen.failure, 'sent bytes no request asked for'); // the rest is no answer to anything
  });

  it('skips interim 1xx answers (103 Early Hints) before the final one', () => {
    const seen = feed([Buffer.from('HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok')]);
    assert.equal(seen.head, 200);
    assert.equal(Buffer.concat(seen.body).toString(), 'ok');
    assert.match(feed([Buffer.from('HTTP/1.1 101 Switching Protocols\r\n\r\n')]).failure ?? '', /switched protocols/);
  });

  it('refuses a head over its limit, bodies longer than announced, and bodies it cannot bound', () => {
    assert.match(
      feed([Buffer.from(`HTTP/1.1 200 OK\r\nx-pad: ${'p'.repeat(2000)}\r\n\r\n`)]).failure ?? '',
      /response head over 1024 bytes/,
    );
    assert.match(feed([Buffer.from('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nabc')]).failure ?? '', /more than its Content-Length/);
    assert.match(
      feed([Buffer.from('HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n')]).failure ?? '',
      /chunked body/,
    );
    assert.match(feed([Buffer.from('HTTP/1.1 200 OK\r\n\r\nabc')]).failure ?? '', /no Content-Length/);
  });
});

describe('both users of the reader (direct GET, piece fetcher) refuse the same malformed answers', () => {
  const servers: net.Server[] = [];
  after(async () => {
    for (const server of servers) await new Promise((resolve) => server.close(resolve));
  });

  /** A raw server answering each request path with the text listed for it. */
  async function rawServer(answers: Record<string, string>): Promise<number> {
    const server = net.createServer((socket) => {
      socket.on('error', () => undefined);
      socket.once('data', (request) => socket.end(answers[request.toString('latin1').split(' ')[1] ?? ''] ?? ''));
    });
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return (server.address() as AddressInfo).port;
  }

  const answers: Record<string, [string, RegExp]> = {
    '/no-colon': ['HTTP/1.1 200 OK\r\ncontent-length: 4\r\nx-broken\r\n\r\nabcd', /header line without a colon/],
    '/obs-fold': ['HTTP/1.1 200 OK\r\ncontent-length: 4\r\nx-a: 1\r\n 2\r\n\r\nabcd', /obs-fold/],
    '/bare-lf': ['HTTP/1.1 200 OK\ncontent-length: 4\n\nabcd', /bare LF/],
    '/lf-then-crlf': ['HTTP/1.1 200 OK\r\ncontent-length: 4\n\r\nabcd', /bare LF/],
    '/bare-cr': ['HTTP/1.1 200 OK\r\nx-a: 1\rcontent-length: 4\r\n\r\nabcd', /bare CR/],
    '/two-lengths': ['HTTP/1.1 200 OK\r\ncontent-length: 4\r\ncontent-length: 40\r\n\r\nabcd', /differing Content-Length/],
    '/hex-length': ['HTTP/1.1 200 OK\r\ncontent-length: 0x4\r\n\r\nabcd', /invalid Content-Length/],
    '/smuggle': [
      'HTTP/1.1 200 OK\r\ncontent-length: 4\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n',
      /both Transfer-Encoding and Content-Length/,
    ],
    '/huge-head': [`HTTP/1.1 200 OK\r\ncontent-length: 4\r\nx-pad: ${'p'.repeat(40_000)}\r\n\r\nabcd`, /response head over/],
  };

  it('names the problem in either, where they used to disagree', async () => {
    const port = await rawServer(Object.fromEntries(Object.entries(answers).map(([path, [text]]) => [path, text])));
    for (const [path, [, message]] of Object.entries(answers)) {
      await assert.rejects(directGet(new URL(`http://127.0.0.1:${port}${path}`), {}), message, `direct GET ${path}`);
      const fetcher = new PieceFetcher('127.0.0.1', port);
      await assert.rejects(
        fetcher.get(path, () => ({ buffer: Buffer.alloc(4), advance: () => undefined }), AbortSignal.timeout(5_000)),
        (error: unknown) => error instanceof PieceProtocolError && message.test(error.message),
        `piece fetcher ${path}`,
      );
      fetcher.close();
    }
  });

  it('both read a chunked answer as one they cannot take: the direct GET hands it back to undici, the fetcher refuses it', async () => {
    const port = await rawServer({ '/chunked': 'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n' });
    assert.equal(await directGet(new URL(`http://127.0.0.1:${port}/chunked`), {}), undefined);
    const fetcher = new PieceFetcher('127.0.0.1', port);
    await assert.rejects(
      fetcher.get('/chunked', () => ({ buffer: Buffer.alloc(4), advance: () => undefined }), AbortSignal.timeout(5_000)),
      /chunked body/,
    );
    fetcher.close();
  });
});
