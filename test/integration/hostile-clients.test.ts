// Clients that are not who the ports expect: another host on the network, callers without the
// cluster token or with a wrong one, malformed and oversized requests, connections left idle.
// Each gets a clear answer, the process goes on serving, and nothing it holds is lost.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { after, before, describe, it } from 'node:test';
import { request, type Dispatcher } from 'undici';
import * as grpc from '@grpc/grpc-js';
import { readFileSync } from 'node:fs';
import http2 from 'node:http2';
import net from 'node:net';
import { itemAt } from '../../src/common/indexing.js';
import { MAX_RANGES } from '../../src/peer/http-range.js';
import { MAX_GRPC_MESSAGE_BYTES } from '../../src/rpc/grpc-listener.js';
import { SchedulerClientClass } from '../../src/rpc/proto.js';
import type { AnnounceHostRequest, PeerPacket, SchedulerServiceClient, TaskStat } from '../../src/rpc/scheduler-api.js';
import { pieceSizeFor } from '../../src/storage/piece-plan.js';
import { hostInfo } from '../fixtures/host-info.js';
import { pushRandomBlob, type PushedBlob } from '../fixtures/images.js';
import { createNetns, type Netns } from '../fixtures/netns.js';
import {
  clusterToken,
  STARLING_CLI,
  startPeer,
  startScheduler,
  type RunningPeerProcess,
  type RunningSchedulerProcess,
} from '../fixtures/peer.js';
import { startRegistry, type Registry } from '../fixtures/registry.js';
import { freePort, makeTempDir, spawnService, waitFor, waitForHttp, type Service, type TempDir } from '../fixtures/processes.js';

describe('hostile clients: the peer mirror', { timeout: 120_000 }, () => {
  let netns: Netns;
  let work: TempDir;
  let peer: RunningPeerProcess;
  let token: string;

  before(async () => {
    work = await makeTempDir('starling-hostile-');
    netns = await createNetns();
    token = randomBytes(24).toString('hex');
    await writeFile(`${work.path}/cluster.token`, token);
    // A mirror listening where another host can reach it (an operator's choice; loopback is the default).
    peer = await startPeer({
      ip: netns.hostIp,
      port: await freePort(netns.hostIp),
      extraArgs: ['--cluster-token-file', `${work.path}/cluster.token`],
    });
  });
  after(async () => {
    await peer?.stop();
    await netns?.remove();
    await work?.remove();
  });

  it('lists its tasks only to this host or a holder of the cluster token', async () => {
    const fromElsewhere = await netns.exec('curl', ['-s', '-o', '/dev/null', '-w', '%{http_code}', `${peer.url}/_starling/tasks`]);
    assert.equal(fromElsewhere.stdout, '403');
    const wrongToken = await netns.exec('curl', [
      '-s',
      '-o',
      '/dev/null',
      '-w',
      '%{http_code}',
      '-H',
      'authorization: Bearer nope',
      `${peer.url}/_starling/tasks`,
    ]);
    assert.equal(wrongToken.stdout, '403');
    const withToken = await netns.exec('curl', ['-s', '-H', `authorization: Bearer ${token}`, `${peer.url}/_starling/tasks`]);
    assert.deepEqual(JSON.parse(withToken.stdout), { tasks: [] });
    const local = await request(`${peer.url}/_starling/tasks`);
    assert.equal(local.statusCode, 200, 'this host may');
    await local.body.dump();
  });
});

describe('hostile clients: oversized and malformed requests on the mirror', { timeout: 120_000 }, () => {
  const SIZE = 1024 * 1024 + 17;
  let registry: Registry;
  let peer: RunningPeerProcess;
  let blob: PushedBlob;

  before(async () => {
    registry = await startRegistry();
    blob = await pushRandomBlob(registry, 'hostile/blob', SIZE);
    peer = await startPeer({ insecure: [registry.host] });
  });
  after(async () => {
    await peer?.stop();
    await registry?.stop();
  });

  const blobUrl = () => `${peer.url}/v2/hostile/blob/blobs/${blob.digest}?ns=${registry.host}`;
  const ociError = async (response: Dispatcher.ResponseData) =>
    itemAt(((await response.body.json()) as { errors: Array<{ code: string; message: string }> }).errors, 0);

  /** Sends a request as written and returns what came back before the peer closed the connection. */
  const rawExchange = (text: string) =>
    new Promise<string>((resolve) => {
      const [host, port] = peer.host.split(':') as [string, string];
      const socket = net.connect(Number(port), host);
      let answer = '';
      socket.on('data', (chunk: Buffer) => (answer += chunk.toString('latin1')));
      socket.on('error', () => undefined);
      socket.on('close', () => resolve(answer));
      socket.write(text);
    });

  it('answers a header block over 16 KiB with 431 and closes the connection, then goes on serving', async () => {
    const answer = await rawExchange(
      `GET /v2/hostile/blob/blobs/${blob.digest}?ns=${registry.host} HTTP/1.1\r\nhost: ${peer.host}\r\nx-pad: ${'x'.repeat(64 * 1024)}\r\n\r\n`,
    );
    assert.match(answer, /^HTTP\/1\.1 431 Request Header Fields Too Large\r\n/);
    const health = await request(`${peer.url}/healthz`);
    assert.equal(await health.body.text(), 'ok\n');
  });

  it('refuses more ranges than allowed (400) and ranges asking for more bytes than the blob (416), naming why, and goes on serving', async () => {
    const tooMany = await request(blobUrl(), {
      headers: { range: `bytes=${Array.from({ length: MAX_RANGES + 1 }, (_, i) => `${i}-${i}`).join(',')}` },
    });
    assert.equal(tooMany.statusCode, 400);
    assert.deepEqual(await ociError(tooMany), { code: 'RANGE_INVALID', message: `more than ${MAX_RANGES} ranges in one request` });

    // The 64 copies of "0-": each one the whole blob.
    const copies = await request(blobUrl(), { headers: { range: `bytes=${Array(MAX_RANGES).fill('0-').join(',')}` } });
    assert.equal(copies.statusCode, 416);
    assert.equal(copies.headers['content-range'], `bytes */${SIZE}`);
    assert.deepEqual(await ociError(copies), {
      code: 'RANGE_INVALID',
      message: `the ranges ask for ${MAX_RANGES * SIZE} bytes in all, more than the blob's ${SIZE}`,
    });
    const overlapping = await request(blobUrl(), { headers: { range: `bytes=0-${SIZE - 2},1-` } });
    assert.equal(overlapping.statusCode, 416);
    assert.match((await ociError(overlapping)).message, new RegExp(`ask for ${2 * SIZE - 2} bytes in all, more than the blob's ${SIZE}`));

    const whole = await request(blobUrl());
    assert.equal(whole.statusCode, 200);
    const hash = createHash('sha256')
      .update(Buffer.from(await whole.body.arrayBuffer()))
      .digest('hex');
    assert.equal(`sha256:${hash}`, blob.digest, 'still serving, the right bytes');
    assert.ok(peer.service.running);
  });
});

describe('hostile clients: connections that never send a request', { timeout: 60_000 }, () => {
  let peer: RunningPeerProcess;
  before(async () => {
    peer = await startPeer();
  });
  after(async () => {
    await peer?.stop();
  });

  it('closes connections that send nothing within the header timeout, and goes on serving', async () => {
    const [host, port] = peer.host.split(':') as [string, string];
    const started = Date.now();
    const closed = await Promise.all(
      Array.from(
        { length: 200 },
        () =>
          new Promise<number>((resolve, reject) => {
            const socket = net.connect(Number(port), host);
            socket.on('error', () => undefined);
            socket.on('close', () => resolve(Date.now() - started));
            setTimeout(() => reject(new Error('a silent connection is still open after 40 s')), 40_000).unref();
          }),
      ),
    );
    assert.ok(Math.max(...closed) < 30_000, `the last silent connection closed after ${Math.max(...closed)} ms`);
    const health = await request(`${peer.url}/healthz`);
    assert.equal(await health.body.text(), 'ok\n');
  });
});

describe('hostile clients: more connections than the cap', { timeout: 60_000 }, () => {
  const CAP = 20;
  let work: TempDir;
  let peer: RunningPeerProcess;
  before(async () => {
    work = await makeTempDir('starling-hostile-cap-');
    await writeFile(`${work.path}/peer.yaml`, `mirror:\n  maxConnections: ${CAP}\n`);
    peer = await startPeer({ extraArgs: ['--config', `${work.path}/peer.yaml`] });
  });
  after(async () => {
    await peer?.stop();
    await work?.remove();
  });

  it('refuses connections past its cap, says so in its log, and answers again once they close', async () => {
    const [host, port] = peer.host.split(':') as [string, string];
    const held = Array.from({ length: CAP }, () => net.connect(Number(port), host).on('error', () => undefined));
    await Promise.all(held.map((socket) => new Promise((resolve) => socket.once('connect', resolve))));
    // Accepted in the order they were made: this one comes after the cap's worth.
    const refused = net.connect(Number(port), host).on('error', () => undefined);
    let answer = '';
    refused.on('data', (chunk: Buffer) => (answer += chunk.toString()));
    refused.write(`GET /healthz HTTP/1.1\r\nhost: ${peer.host}\r\n\r\n`);
    await new Promise((resolve) => refused.once('close', resolve));
    assert.equal(answer, '', 'a connection past the cap gets no answer');
    await waitFor(() => /connection limit reached/.test(peer.service.readLog()), 5_000, 'the log line saying the limit was reached');
    const line = peer.service
      .readLog()
      .split('\n')
      .find((l) => l.includes('connection limit reached'));
    assert.ok(line, 'a log line says the connection limit was reached');
    assert.match(line, new RegExp(`"server":"peer mirror".*"maxConnections":${CAP}.*"refused":1`));

    for (const socket of held) socket.destroy();
    await waitFor(
      async () => {
        const health = await request(`${peer.url}/healthz`);
        return (await health.body.text()) === 'ok\n';
      },
      5_000,
      '/healthz once the connections closed',
    );
    assert.ok(peer.service.running);
  });
});

describe('hostile clients: the upload port, from another host', { timeout: 120_000 }, () => {
  let netns: Netns;
  let scheduler: RunningSchedulerProcess;
  let peer: RunningPeerProcess;
  let upload: string;
  let token: string;

  before(async () => {
    netns = await createNetns();
    token = (await clusterToken()).token;
    scheduler = await startScheduler();
    peer = await startPeer({ ip: netns.hostIp, schedulers: [scheduler.address] });
    upload = `http://${netns.hostIp}:${peer.options.uploadPort}`;
  });
  after(async () => {
    await peer?.stop();
    await scheduler?.stop();
    await netns?.remove();
  });

  const curl = (args: string[], input?: string) =>
    netns.exec('curl', ['-s', '-w', '\n%{http_code}', ...args], input === undefined ? {} : { input });
  const status = (result: { stdout: string }) => result.stdout.split('\n').at(-1);

  it('answers nothing but /healthz without the cluster token: no pieces, no seed or preheat fetch of a URL it is handed', async () => {
    const body = JSON.stringify({
      taskId: `sha256:${'1'.repeat(64)}`,
      contentLength: 10,
      pieceSize: 4194304,
      origin: { url: 'http://169.254.169.254/latest/meta-data', headers: {} },
    });
    for (const args of [
      [`${upload}/_starling/tasks/sha256:${'1'.repeat(64)}/pieces`],
      [`${upload}/_starling/pieces/sha256:${'1'.repeat(64)}/0`],
      ['-X', 'POST', '-H', 'content-type: application/json', '-d', body, `${upload}/_starling/preheat`],
      ['-X', 'POST', '-H', 'authorization: Bearer wrong-token', '-d', body, `${upload}/_starling/seed`],
    ]) {
      const result = await curl(args);
      assert.equal(status(result), '401', args.join(' '));
      assert.match(result.stdout, /missing or wrong cluster token/);
    }
    assert.equal(status(await curl([`${upload}/healthz`])), '200');
  });

  it('refuses malformed and oversized requests from a token holder with clear answers, and goes on serving', async () => {
    const auth = ['-H', `authorization: Bearer ${token}`];
    const huge = `{"pad":"${'x'.repeat(200_000)}"}`;
    const tooBig = await curl(
      [...auth, '-X', 'POST', '-H', 'content-type: application/json', '--data-binary', '@-', `${upload}/_starling/preheat`],
      huge,
    );
    assert.equal(status(tooBig), '400');
    assert.match(tooBig.stdout, /body larger than 65536 bytes/);
    const notJson = await curl([...auth, '-X', 'POST', '-d', '{nope', `${upload}/_starling/preheat`]);
    assert.equal(status(notJson), '400');
    const notRegistry = await curl([
      ...auth,
      '-X',
      'POST',
      '-d',
      JSON.stringify({
        taskId: `sha256:${'1'.repeat(64)}`,
        contentLength: 10,
        pieceSize: 4194304,
        origin: { url: 'http://169.254.169.254/latest/meta-data', headers: {} },
      }),
      `${upload}/_starling/preheat`,
    ]);
    assert.equal(status(notRegistry), '400');
    assert.match(notRegistry.stdout, /is not a registry blob path/);
    const misspelt = await curl([
      ...auth,
      '-X',
      'POST',
      '-d',
      JSON.stringify({
        taskId: `sha256:${'1'.repeat(64)}`,
        contentLenght: 10,
        pieceSize: 4194304,
        origin: { url: `http://127.0.0.1:1/v2/a/blobs/sha256:${'1'.repeat(64)}` },
      }),
      `${upload}/_starling/preheat`,
    ]);
    assert.equal(status(misspelt), '400');
    assert.match(misspelt.stdout, /bad preheat request: contentLength: [^;]*; unknown key \\"contentLenght\\"/);
    const badPath = await curl([...auth, `${upload}/_starling/pieces/sha256:zz/0`]);
    assert.equal(status(badPath), '404');
    assert.ok(peer.service.running);
    assert.equal(status(await curl([`${upload}/healthz`])), '200');
  });
  it('refuses, from a token holder over plain HTTP, a preheat carrying registry credentials, naming why', async () => {
    const withCredentials = await curl([
      '-H',
      `authorization: Bearer ${token}`,
      '-X',
      'POST',
      '-d',
      JSON.stringify({
        taskId: `sha256:${'3'.repeat(64)}`,
        contentLength: 10,
        pieceSize: 4194304,
        origin: { url: `http://127.0.0.1:1/v2/private/app/blobs/sha256:${'3'.repeat(64)}`, headers: { authorization: 'Basic c2VjcmV0' } },
      }),
      `${upload}/_starling/preheat`,
    ]);
    assert.equal(status(withCredentials), '403');
    assert.match(withCredentials.stdout, /a request carrying registry credentials \(origin\.headers\) is accepted only over TLS/);
    assert.ok(peer.service.running);
  });
});

describe('hostile clients: the scheduler port', { timeout: 60_000 }, () => {
  let scheduler: RunningSchedulerProcess;
  let client: SchedulerServiceClient;
  let token: string;

  before(async () => {
    token = (await clusterToken()).token;
    scheduler = await startScheduler();
    const Service = SchedulerClientClass();
    client = new Service(scheduler.address, grpc.credentials.createInsecure());
  });
  after(async () => {
    client?.close();
    await scheduler?.stop();
  });

  const metadata = (value = `Bearer ${token}`) => {
    const m = new grpc.Metadata();
    m.set('authorization', value);
    return m;
  };
  const host = hostInfo('h1', { ip: '127.0.0.9' });
  const announce = (body: unknown, m = metadata()) =>
    // `as`: a hostile client's body is whatever it likes, which is the point here.
    new Promise<grpc.ServiceError | null>((resolve) =>
      client.AnnounceHost(body as AnnounceHostRequest, m, { deadline: Date.now() + 5_000 }, (error: grpc.ServiceError | null) =>
        resolve(error),
      ),
    );
  const register = (packet: unknown) =>
    new Promise<grpc.ServiceError>((resolve) => {
      const stream = client.AnnouncePeer(metadata());
      stream.on('data', () => undefined);
      stream.on('error', (error: grpc.ServiceError) => resolve(error));
      stream.write({ register: packet } as PeerPacket); // as hostile as announce()'s body
    });

  it('refuses a wrong token, a malformed host, a task of 10^9 one-byte pieces and a register carrying credentials, naming each, and goes on serving', async () => {
    assert.equal((await announce({ host }, metadata('Bearer nope')))?.code, grpc.status.UNAUTHENTICATED);
    const badIp = await announce({ host: { ...host, ip: '../../etc' } });
    assert.equal(badIp?.code, grpc.status.INVALID_ARGUMENT);
    assert.match(badIp.details, /host ip "\.\.\/\.\.\/etc" is not an IP address/);
    assert.equal(await announce({ host }), null);
    const digest = `sha256:${'2'.repeat(64)}`;
    const started = Date.now();
    const tiny = await register({ peerId: `h1|${digest}`, hostId: 'h1', taskId: digest, contentLength: 1e9, pieceSize: 1, heldPieces: [] });
    assert.equal(tiny.code, grpc.status.INVALID_ARGUMENT);
    assert.match(tiny.details, /piece size 1 is not the 4194304 a blob of 1000000000 bytes is cut into/);
    assert.ok(Date.now() - started < 2_000, 'answered at once, no piece table built');
    const leaking = await register({
      peerId: `h1|${digest}`,
      hostId: 'h1',
      taskId: digest,
      contentLength: 10,
      pieceSize: 4194304,
      heldPieces: [],
      origin: { url: `http://127.0.0.1:5000/v2/x/blobs/${digest}`, headers: { authorization: 'Basic c2VjcmV0' } },
    });
    assert.match(leaking.details, /registry credentials must not be sent to the scheduler/);
    const notDigest = await register({
      peerId: 'h1|x',
      hostId: 'h1',
      taskId: '../../x',
      contentLength: 10,
      pieceSize: 4194304,
      heldPieces: [],
    });
    assert.match(notDigest.details, /task id: malformed digest/);
    assert.equal(await announce({ host }), null, 'still serving');
  });

  it('refuses a message over its 16 MiB receive limit with RESOURCE_EXHAUSTED naming the sizes, and goes on serving', async () => {
    const huge = await announce({ host: { ...host, hostname: 'x'.repeat(17 * 1024 * 1024) } });
    assert.equal(huge?.code, grpc.status.RESOURCE_EXHAUSTED);
    assert.match(huge.details, new RegExp(`larger than max \\(\\d+ vs\\.? ${MAX_GRPC_MESSAGE_BYTES}\\)`));
    assert.equal(await announce({ host }), null, 'still serving');
    assert.ok(scheduler.service.running);
  });
});

/**
 * An HTTP/2 client of its own: it sends the preface, answers the server's settings and pings, and
 * on the server's GOAWAY stops reading, and never closes its side of the connection.
 */
function stubbornHttp2Client(port: number, host: string) {
  const frame = (type: number, flags: number, payload = Buffer.alloc(0)) => {
    const head = Buffer.alloc(9);
    head.writeUIntBE(payload.length, 0, 3);
    head[3] = type;
    head[4] = flags;
    return Buffer.concat([head, payload]);
  };
  // Half-open allowed: when the server ends its side, this client does not end its own.
  const client = { socket: net.connect({ port, host, allowHalfOpen: true }), settings: 0, pingsAnswered: 0, goaway: false };
  client.socket.on('error', () => undefined);
  client.socket.write(Buffer.concat([Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'), frame(0x4, 0)]));
  let buffer = Buffer.alloc(0);
  client.socket.on('data', (chunk: Buffer) => {
    buffer = Buffer.concat([buffer, chunk]);
    while (buffer.length >= 9 && buffer.length >= 9 + buffer.readUIntBE(0, 3)) {
      const length = buffer.readUIntBE(0, 3);
      const [type, flags] = [buffer.readUInt8(3), buffer.readUInt8(4) & 0x1];
      const payload = buffer.subarray(9, 9 + length);
      buffer = buffer.subarray(9 + length);
      if (type === 0x4 && !flags) {
        client.settings++;
        client.socket.write(frame(0x4, 0x1));
      } else if (type === 0x6 && !flags) {
        client.pingsAnswered++;
        client.socket.write(frame(0x6, 0x1, payload));
      } else if (type === 0x7) {
        client.goaway = true;
        client.socket.pause();
        return;
      }
    }
  });
  return client;
}

describe("hostile clients: the scheduler's connections", { timeout: 60_000 }, () => {
  const LIMITS = { maxConnections: 40, maxStreamsPerConnection: 64, idleConnectionMs: 1_500, keepaliveMs: 300, keepaliveTimeoutMs: 1_000 };
  let work: TempDir;
  let scheduler: RunningSchedulerProcess;
  let token: string;

  before(async () => {
    work = await makeTempDir('starling-hostile-grpc-');
    token = (await clusterToken()).token;
    await writeFile(`${work.path}/scheduler.yaml`, JSON.stringify({ limits: LIMITS }));
    scheduler = await startScheduler({ extraArgs: ['--config', `${work.path}/scheduler.yaml`] });
  });
  after(async () => {
    await scheduler?.stop();
    await work?.remove();
  });

  it('tells clients its stream bound, pings them, refuses connections past its cap with a log line, closes idle ones (a client that ignores the goodbye too), and goes on serving', async () => {
    const [host, portText] = scheduler.address.split(':') as [string, string];
    const port = Number(portText);
    const opened = Date.now();
    const closedAfter = (emitter: { once(event: 'close', listener: () => void): unknown }) =>
      new Promise<number>((resolve) => emitter.once('close', () => resolve(Date.now() - opened)));
    // The cap's worth: HTTP/2 clients that never open a stream, clients that never send a byte
    // (nor read one), and clients that answer pings but ignore the server's goodbye.
    const sessions = Array.from({ length: 20 }, () => http2.connect(`http://${scheduler.address}`).on('error', () => undefined));
    const settings = sessions.map((session) => new Promise<http2.Settings>((resolve) => session.once('remoteSettings', resolve)));
    const pinged = sessions.map((session) => new Promise<void>((resolve) => session.once('ping', () => resolve())));
    const sessionsClosed = sessions.map(closedAfter);
    const silent = Array.from({ length: 10 }, () =>
      net
        .connect(port, host)
        .on('error', () => undefined)
        .pause(),
    );
    const stubborn = Array.from({ length: 10 }, () => stubbornHttp2Client(port, host));
    for (const remote of await Promise.all(settings)) assert.equal(remote.maxConcurrentStreams, LIMITS.maxStreamsPerConnection);
    await waitFor(
      () => stubborn.every((c) => c.settings > 0) && silent.every((s) => s.readyState === 'open'),
      5_000,
      'every connection held',
    );

    const extra = net.connect(port, host).on('error', () => undefined);
    let extraBytes = 0;
    extra.on('data', (chunk: Buffer) => (extraBytes += chunk.length));
    await closedAfter(extra);
    assert.equal(extraBytes, 0, 'the connection past the cap was closed before the server said a word');
    await waitFor(() => /connection limit reached/.test(scheduler.service.readLog()), 5_000, 'the log line saying the limit was reached');
    const line = scheduler.service
      .readLog()
      .split('\n')
      .find((l) => l.includes('connection limit reached'));
    assert.ok(line, 'a log line says the connection limit was reached');
    assert.match(line, /"server":"scheduler gRPC".*"maxConnections":40/);

    await Promise.all(pinged);
    const times = await Promise.all(sessionsClosed);
    assert.ok(
      Math.min(...times) >= LIMITS.idleConnectionMs - 100,
      `a session was closed after ${Math.min(...times)} ms, before it was idle long enough`,
    );
    assert.ok(Math.max(...times) < 10_000, `the last idle session closed after ${Math.max(...times)} ms`);
    await waitFor(() => stubborn.every((c) => c.goaway), 5_000, 'a GOAWAY to every stubborn client');
    assert.ok(stubborn.every((c) => c.pingsAnswered > 0));

    // Every slot comes free, those of the clients that never close included: the cap's worth of new connections is served.
    await waitFor(
      async () => {
        const fresh = Array.from({ length: LIMITS.maxConnections }, () => net.connect(port, host).on('error', () => undefined));
        const answered = await Promise.all(
          fresh.map(
            (socket) =>
              new Promise<boolean>((resolve) => {
                socket.once('data', () => resolve(true));
                socket.once('close', () => resolve(false));
                setTimeout(() => resolve(false), 1_000).unref();
              }),
          ),
        );
        for (const socket of fresh) socket.destroy();
        return answered.every(Boolean);
      },
      15_000,
      'every connection slot free again',
    );

    const client = new (SchedulerClientClass())(scheduler.address, grpc.credentials.createInsecure());
    try {
      // The probes' slots come free as the server sees them close, which on a busy machine may be
      // after this client connects (its connection is then refused, as past the cap): it connects
      // again, on gRPC's backoff, until one is kept.
      await new Promise<void>((resolve, reject) =>
        client.waitForReady(Date.now() + 10_000, (error) => (error ? reject(error) : resolve())),
      );
      const metadata = new grpc.Metadata();
      metadata.set('authorization', `Bearer ${token}`);
      const answer = await new Promise<grpc.ServiceError | null>((resolve) =>
        client.AnnounceHost({ host: hostInfo('after-idle', { ip: '127.0.0.9' }) }, metadata, { deadline: Date.now() + 5_000 }, resolve),
      );
      assert.equal(answer, null, 'the scheduler serves');
    } finally {
      client.close();
      for (const c of [...silent, ...stubborn.map((s) => s.socket)]) c.destroy();
    }
    assert.ok(scheduler.service.running);
  });
});

describe("hostile clients: the scheduler's task state, from another host", { timeout: 60_000 }, () => {
  let netns: Netns;
  let scheduler: RunningSchedulerProcess;
  let client: SchedulerServiceClient;
  let stream: ReturnType<SchedulerServiceClient['AnnouncePeer']>;
  let token: string;
  const digest = `sha256:${'4'.repeat(64)}`;

  before(async () => {
    netns = await createNetns();
    token = (await clusterToken()).token;
    // Listening where another host can reach it, as the manifests' scheduler does (0.0.0.0:8003).
    scheduler = await startScheduler({ ip: netns.hostIp });
    client = new (SchedulerClientClass())(scheduler.address, grpc.credentials.createInsecure());
    const metadata = new grpc.Metadata();
    metadata.set('authorization', `Bearer ${token}`);
    const host = hostInfo('holder', { ip: '127.0.0.9', labels: { zone: 'secret-zone' } });
    await new Promise<void>((resolve, reject) =>
      client.AnnounceHost({ host }, metadata, { deadline: Date.now() + 5_000 }, (error: grpc.ServiceError | null) =>
        error ? reject(error) : resolve(),
      ),
    );
    stream = client.AnnouncePeer(metadata);
    stream.on('data', () => undefined);
    stream.on('error', () => undefined);
    stream.write({
      packet: 'register',
      register: {
        peerId: `holder|${digest}`,
        hostId: 'holder',
        taskId: digest,
        contentLength: 10,
        pieceSize: pieceSizeFor(10),
        heldPieces: [],
      },
    });
    await waitFor(
      async () => {
        const response = await scheduler.task(digest);
        await response.body.dump();
        return response.statusCode === 200;
      },
      5_000,
      'the task registered',
    );
  });
  after(async () => {
    stream?.end();
    client?.close();
    await scheduler?.stop();
    await netns?.remove();
  });

  it('answers /api/tasks/<digest> only to this host or a holder of the cluster token', async () => {
    const url = `${scheduler.metricsUrl.replace('/metrics', '')}/api/tasks/${digest}`;
    const curl = async (args: string[]) => {
      const result = await netns.exec('curl', ['-s', '-w', '\n%{http_code}', ...args, url]);
      const lines = result.stdout.split('\n');
      return { status: lines.at(-1), body: lines.slice(0, -1).join('\n') };
    };
    for (const args of [[], ['-H', 'authorization: Bearer wrong-token']]) {
      const refused = await curl(args);
      assert.equal(refused.status, '403', args.join(' ') || 'no token');
      assert.deepEqual(JSON.parse(refused.body), { error: 'task state is only for the local host or a holder of the cluster token' });
    }
    const withToken = await curl(['-H', `authorization: Bearer ${token}`]);
    assert.equal(withToken.status, '200');
    assert.deepEqual(
      (JSON.parse(withToken.body) as TaskStat).peers.map((p) => [p.hostId, p.labels]),
      [['holder', { zone: 'secret-zone' }]],
    );
    const local = await request(url);
    assert.equal(local.statusCode, 200, 'this host may, without the token');
    assert.equal(((await local.body.json()) as TaskStat).taskId, digest);
    const metrics = await netns.exec('curl', ['-s', '-o', '/dev/null', '-w', '%{http_code}', scheduler.metricsUrl]);
    assert.equal(metrics.stdout, '200', '/metrics stays open to Prometheus');
  });
});

describe('hostile clients: the manager', { timeout: 60_000 }, () => {
  let work: TempDir;
  let manager: Service;
  let url: string;

  before(async () => {
    work = await makeTempDir('starling-hostile-manager-');
    const port = await freePort();
    url = `http://127.0.0.1:${port}`;
    manager = await spawnService({
      cmd: process.execPath,
      args: [
        STARLING_CLI,
        'manager',
        '--listen',
        `127.0.0.1:${port}`,
        '--data-dir',
        work.path,
        '--cluster-token-file',
        (await clusterToken()).file,
        '--log-level',
        'warn',
      ],
      name: 'hostile-manager',
    });
    await waitForHttp(`${url}/healthz`, 20_000, manager);
  });
  after(async () => {
    await manager?.stop();
    await work?.remove();
  });

  const rss = () => {
    const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${manager.pid}/status`, 'utf8'));
    assert.ok(match, `a VmRSS line in /proc/${manager.pid}/status`);
    return Number(itemAt(match, 1)) * 1024;
  };

  it('checks the token before reading a body, and refuses bodies over its limit before parsing them', async () => {
    const body = Buffer.alloc(32 * 1024 * 1024, 0x20);
    body.write('{"hostname":"x","ip":"127.0.0.1","port":1,"pad":"', 0);
    const before = rss();
    for (let i = 0; i < 10; i++) {
      const response = await request(`${url}/api/v1/schedulers/keepalive`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body,
      });
      assert.equal(response.statusCode, 401);
      await response.body.dump();
    }
    const grown = rss() - before;
    // Parsing them grew it by 576 MB (97 → 673). Discarding them unread still passes 320 MB through
    // Node's socket buffers, which the allocator gives back in its own time: 68 MB was seen once.
    assert.ok(grown < 160 * 1024 * 1024, `RSS grew ${Math.round(grown / 2 ** 20)} MB for ten 32 MiB bodies without a token`);
    const tooBig = await request(`${url}/api/v1/schedulers/keepalive`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${(await clusterToken()).token}` },
      body: Buffer.alloc(2 * 1024 * 1024, 0x20),
    });
    assert.equal(tooBig.statusCode, 413);
    assert.equal(((await tooBig.body.json()) as { error: { code: string } }).error.code, 'too_large');
    assert.ok(manager.running);
  });
});
