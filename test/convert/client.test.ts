/* RegistryClient auth against a scripted registry: Bearer tokens per scope, Basic, and clear refusals. */
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, test } from 'node:test';
import { parseChallenge, parseCredentials, RegistryClient, RegistryError } from '../../src/oci/client.js';
import { digestOf } from '../../src/oci/digest.js';
import { RegistryHosts } from '../../src/oci/registry-hosts.js';

const MANIFEST = Buffer.from('{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{},"layers":[]}');
let server: Server;
let host: string;
const tokenRequests: URL[] = [];
const registryAuth: string[] = [];

function basicOk(req: IncomingMessage): boolean {
  return req.headers.authorization === `Basic ${Buffer.from('bob:pw').toString('base64')}`;
}

before(async () => {
  server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', `http://${host}`);
    if (url.pathname === '/token') {
      tokenRequests.push(url);
      if (req.headers.authorization && !basicOk(req)) {
        res.writeHead(401, { 'content-type': 'application/json' }).end('{"details":"incorrect username or password"}');
        return;
      }
      res
        .writeHead(200, { 'content-type': 'application/json' })
        .end(JSON.stringify({ token: `tok-${url.searchParams.getAll('scope').join('+')}`, expires_in: 300 }));
      return;
    }
    registryAuth.push(req.headers.authorization ?? '');
    const bearer = /^\/v2\/(.+)\/manifests\//.exec(url.pathname);
    if (bearer && !url.pathname.includes('/basic/')) {
      if (req.headers.authorization !== `Bearer tok-repository:${bearer[1]}:pull`) {
        res.writeHead(401, {
          'www-authenticate': `Bearer realm="http://${host}/token",service="test-registry",scope="repository:${bearer[1]}:pull"`,
          'content-type': 'application/json',
        });
        res.end('{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}');
        return;
      }
    } else if (!basicOk(req)) {
      res.writeHead(401, { 'www-authenticate': 'Basic realm="test"' }).end();
      return;
    }
    if (url.pathname.endsWith('/missing')) {
      res
        .writeHead(404, { 'content-type': 'application/json' })
        .end('{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown","detail":{"Tag":"missing"}}]}');
      return;
    }
    res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json' }).end(MANIFEST);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  host = `127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(() => new Promise<void>((resolve) => server.close(() => resolve())));

const hosts = () => new RegistryHosts([host]);

test('Bearer: anonymous first, then a token from the realm with service and scope, cached per scope', async () => {
  const client = new RegistryClient(host, { hosts: hosts() });
  try {
    tokenRequests.length = 0;
    registryAuth.length = 0;
    const manifest = await client.getManifest('team/app', 'v1');
    assert.equal(manifest.digest, digestOf(MANIFEST));
    assert.equal(manifest.mediaType, 'application/vnd.oci.image.manifest.v1+json');
    await client.getManifest('team/app', 'v2');
    assert.equal(tokenRequests.length, 1, 'one token for two requests of the same scope');
    assert.equal(tokenRequests[0]?.searchParams.get('service'), 'test-registry');
    assert.deepEqual(tokenRequests[0]?.searchParams.getAll('scope'), ['repository:team/app:pull']);
    assert.deepEqual(registryAuth, ['', 'Bearer tok-repository:team/app:pull', 'Bearer tok-repository:team/app:pull']);
    await client.getManifest('team/other', 'v1');
    assert.equal(tokenRequests.length, 2, 'another scope, another token');
    await assert.rejects(client.getManifest('team/app', 'missing'), (e: RegistryError) => {
      assert.equal(e.status, 404);
      assert.equal(e.code, 'MANIFEST_UNKNOWN');
      assert.match(
        e.message,
        new RegExp(
          `^registry ${host}, repository team/app: GET manifest missing: HTTP 404 MANIFEST_UNKNOWN: manifest unknown; \\{"Tag":"missing"\\}$`,
        ),
      );
      return true;
    });
  } finally {
    await client.close();
  }
});

test('Bearer with credentials: Basic to the token service; refused credentials are named', async () => {
  const good = new RegistryClient(host, { hosts: hosts(), credentials: parseCredentials('bob:pw') });
  const bad = new RegistryClient(host, { hosts: hosts(), credentials: parseCredentials('bob:nope') });
  try {
    await good.getManifest('team/app', 'v1');
    await assert.rejects(
      bad.getManifest('team/app', 'v1'),
      /registry 127\.0\.0\.1:\d+, repository team\/app: GET manifest v1: the token service at http:\/\/127\.0\.0\.1:\d+ refused the credentials \(HTTP 401, .*incorrect username or password/,
    );
  } finally {
    await good.close();
    await bad.close();
  }
});

test('Basic: credentials after the challenge, then up front; none given is a clear error', async () => {
  const client = new RegistryClient(host, { hosts: hosts(), credentials: { username: 'bob', password: 'pw' } });
  try {
    registryAuth.length = 0;
    await client.getManifest('basic/app', 'v1');
    await client.getManifest('basic/app', 'v1');
    assert.equal(registryAuth[0], '');
    assert.equal(registryAuth.length, 3, 'after one challenge, Basic goes with every request');
    await assert.rejects(
      new RegistryClient(host, { hosts: hosts() }).getManifest('basic/app', 'v1'),
      /requires credentials \(HTTP 401, Basic auth\)/,
    );
    await assert.rejects(
      new RegistryClient(host, { hosts: hosts(), credentials: { username: 'bob', password: 'x' } }).getManifest('basic/app', 'v1'),
      /refused the credentials \(HTTP 401/,
    );
  } finally {
    await client.close();
  }
});

test('challenge and credential parsing', () => {
  assert.deepEqual(
    parseChallenge('Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push"'),
    {
      scheme: 'bearer',
      params: { realm: 'https://auth.example/token', service: 'registry.example', scope: 'repository:a/b:pull,push' },
    },
  );
  assert.deepEqual(parseChallenge('Basic realm=x'), { scheme: 'basic', params: { realm: 'x' } });
  assert.deepEqual(parseCredentials('u:p:with:colons'), { username: 'u', password: 'p:with:colons' });
  assert.throws(() => parseCredentials('nocolon', '--src-creds'), /--src-creds must be USER:PASSWORD/);
});
