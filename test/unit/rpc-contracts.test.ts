// The bodies peers, schedulers and the manager send each other: one schema per wire (src/rpc/),
// the one the receiver validates with. A bad body is refused with every field at fault named.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { peerKeepaliveSchema, schedulerKeepaliveSchema } from '../../src/rpc/manager-api.js';
import { checkPeerPacket, SchedulerInputError } from '../../src/rpc/scheduler-checks.js';
import { blobFetchRequestSchema, fetchStatusSchema } from '../../src/rpc/upload-api.js';
import { parseWire, WireError } from '../../src/rpc/wire.js';

const digest = `sha256:${'a'.repeat(64)}`;
const fetchRequest = {
  taskId: digest,
  contentLength: 10,
  pieceSize: 4 << 20,
  origin: { url: `http://127.0.0.1:5000/v2/app/blobs/${digest}`, headers: {} },
};

/** What parseWire says of `value`, or 'ok'. */
function problem(schema: Parameters<typeof parseWire>[0], value: unknown, what: string): string {
  try {
    parseWire(schema, value, what);
    return 'ok';
  } catch (error) {
    assert.ok(error instanceof WireError);
    return error.message;
  }
}

describe('wire contracts (src/rpc/)', () => {
  it('takes a seed or preheat request as the scheduler and the manager send it; origin headers default to none', () => {
    assert.deepEqual(parseWire(blobFetchRequestSchema, fetchRequest, 'seed request'), fetchRequest);
    const { headers: _, ...origin } = fetchRequest.origin;
    assert.deepEqual(parseWire(blobFetchRequestSchema, { ...fetchRequest, origin }, 'seed request').origin.headers, {});
  });

  const badRequests: Array<[string, unknown, RegExp]> = [
    ['not an object', 'fetch it', /^bad preheat request: \(top level\): /],
    ['a digest that is not sha256', { ...fetchRequest, taskId: 'md5:1' }, /taskId: must be sha256:<64 hex digits>/],
    ['a negative length', { ...fetchRequest, contentLength: -1 }, /contentLength: /],
    ['a fractional piece size', { ...fetchRequest, pieceSize: 1.5 }, /pieceSize: /],
    [
      'an origin that is not http(s)',
      { ...fetchRequest, origin: { url: 'file:///etc/passwd', headers: {} } },
      /origin\.url: must be an http\(s\) URL/,
    ],
    [
      'a header value that is not a string',
      { ...fetchRequest, origin: { ...fetchRequest.origin, headers: { authorization: 1 } } },
      /origin\.headers\.authorization: /,
    ],
    ['an unknown (misspelt) field', { ...fetchRequest, pieceSise: 4 }, /unknown key "pieceSise"/],
  ];
  for (const [what, body, message] of badRequests) {
    it(`refuses a preheat request with ${what}, naming the field`, () => {
      assert.match(problem(blobFetchRequestSchema, body, 'preheat request'), message);
    });
  }

  it('names every field at fault at once, not only the first', () => {
    const message = problem(blobFetchRequestSchema, { ...fetchRequest, contentLength: 'ten', pieceSize: 0 }, 'seed request');
    assert.match(message, /^bad seed request: contentLength: .*; pieceSize: /);
  });

  it("reads a peer's fetch status, and names what is wrong with a malformed one", () => {
    assert.deepEqual(parseWire(fetchStatusSchema, { digest, size: 10, storedBytes: 4, complete: false }, 'preheat status'), {
      digest,
      size: 10,
      storedBytes: 4,
      complete: false,
    });
    assert.match(
      problem(fetchStatusSchema, { digest, size: 10, storedBytes: -4, complete: 'yes' }, 'preheat status'),
      /storedBytes: .*; complete: /,
    );
  });

  it('takes a peer keepalive with its defaults, and refuses one with a bad task report', () => {
    const keepalive = { hostId: 'h1', hostname: 'h1', ip: '127.0.0.1', uploadPort: 65002, mirrorUrl: 'http://127.0.0.1:65001' };
    assert.deepEqual(parseWire(peerKeepaliveSchema, keepalive, 'keepalive'), { ...keepalive, labels: {}, seed: false });
    const tasks = [{ digest, size: 1, complete: true, bytesFrom: { peer: 0, seed: 0, origin: 1, cache: 1 } }];
    assert.match(
      problem(peerKeepaliveSchema, { ...keepalive, ip: 'localhost', tasks }, 'keepalive'),
      /ip: must be an IPv4 or IPv6 address; unknown key "tasks\.0\.bytesFrom\.cache"/,
    );
  });

  it('takes a scheduler keepalive, and names a bad cluster name and port', () => {
    const keepalive = { hostname: 's1', ip: '::1', port: 8002, clusterName: 'zone-a' };
    assert.deepEqual(parseWire(schedulerKeepaliveSchema, keepalive, 'keepalive'), keepalive);
    assert.match(
      problem(schedulerKeepaliveSchema, { ...keepalive, port: 70000, clusterName: '-a' }, 'keepalive'),
      /port: .*; clusterName: must be letters, digits/,
    );
  });

  it("takes a piece start with or without the parent it comes from (empty, as gRPC's default, is the origin), and refuses an overlong parent id", () => {
    for (const parentId of [undefined, '', 'h2|' + digest]) {
      const packet = { packet: 'pieceStarted' as const, pieceStarted: { index: 3, parentId } };
      assert.deepEqual(checkPeerPacket(packet), packet);
    }
    assert.throws(
      () => checkPeerPacket({ packet: 'pieceStarted', pieceStarted: { index: 3, parentId: 'x'.repeat(300) } }),
      (error: unknown) => error instanceof SchedulerInputError && /piece parent id is longer than 256 characters/.test(error.message),
    );
  });
});
