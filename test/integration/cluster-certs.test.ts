// `starling certs`: a cluster CA and a certificate per component for the Kubernetes Secrets,
// renewed under the same CA, and a CA replaced in three steps during which every pod, old or new,
// can still complete a handshake with every other.
import assert from 'node:assert/strict';
import { X509Certificate, generateKeyPairSync } from 'node:crypto';
import { copyFile, mkdir, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import { after, before, describe, it } from 'node:test';
import { kubernetesLeafNames } from '../../src/cli/commands/certs.js';
import { writeClusterCertificates, type CaStep } from '../../src/common/tls-files.js';
import { clientTlsOptions, loadTls, pemCertificates, serverTlsOptions, type ClusterTls } from '../../src/common/tls.js';
import { STARLING_CLI } from '../fixtures/peer.js';
import { run } from '../fixtures/processes.js';

const COMPONENTS = ['manager', 'scheduler', 'peer'];

describe('starling certs', () => {
  let root: string;
  let count = 0;
  /** A fresh folder for one test. */
  const folder = async () => {
    const dir = join(root, `run-${++count}`);
    await mkdir(dir);
    return dir;
  };
  const write = (dir: string, ca: CaStep = 'keep') =>
    writeClusterCertificates(dir, { leaves: kubernetesLeafNames('starling'), days: 30, ca });
  /** A component's files as it loads them (the Secret's tls.crt, tls.key and ca.crt). */
  const load = (dir: string, component: string) => {
    const tls = loadTls({ cert: join(dir, `${component}.crt`), key: join(dir, `${component}.key`), ca: join(dir, 'ca.crt') });
    assert.ok(tls, `${component}'s files are given`);
    return tls;
  };
  /** A copy of what a pod holds now (its Secret is fixed while it runs). */
  const snapshot = async (dir: string, component: string): Promise<ClusterTls> => load(dir, component);
  const serial = async (file: string) => new X509Certificate(await readFile(file)).serialNumber;

  before(async () => {
    root = await mkdtemp(join(tmpdir(), 'starling-certs-unit-'));
  });
  after(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it('writes a CA and a certificate for each component that the components load, keys readable by their owner only', async () => {
    const dir = await folder();
    const lines = await write(dir);
    assert.match(lines.join('\n'), /a new CA, CN=Starling cluster CA [0-9a-f]{8}/);
    for (const component of COMPONENTS) {
      load(dir, component);
      assert.equal((await stat(join(dir, `${component}.key`))).mode & 0o777, 0o600);
    }
    assert.equal((await stat(join(dir, 'ca.key'))).mode & 0o777, 0o600);
    const manager = new X509Certificate(await readFile(join(dir, 'manager.crt')));
    assert.match(manager.subjectAltName ?? '', /DNS:starling-manager\.starling\.svc\b/);
    assert.match(manager.subjectAltName ?? '', /IP Address:127\.0\.0\.1/);
    assert.match(
      new X509Certificate(await readFile(join(dir, 'scheduler.crt'))).subjectAltName ?? '',
      /DNS:\*\.starling-scheduler\.starling\.svc\b/,
    );
    assert.ok(Date.parse(manager.validTo) < Date.now() + 31 * 24 * 3600_000, 'valid for the days asked');
  });

  it('renews the certificates under the same CA: pods with an old and a new one still talk', async () => {
    const dir = await folder();
    await write(dir);
    const ca = await readFile(join(dir, 'ca.crt'), 'utf8');
    const before = await serial(join(dir, 'peer.crt'));
    const oldPeer = await snapshot(dir, 'peer');
    await write(dir);
    assert.equal(await readFile(join(dir, 'ca.crt'), 'utf8'), ca, 'the CA is kept');
    assert.notEqual(await serial(join(dir, 'peer.crt')), before, 'a new certificate');
    await handshake(await snapshot(dir, 'scheduler'), oldPeer);
    await handshake(oldPeer, await snapshot(dir, 'scheduler'));
  });

  it('replaces the CA in three steps, each of which leaves old and new pods able to talk', async () => {
    const dir = await folder();
    await write(dir);
    const original = await snapshot(dir, 'manager');
    const oldCaKey = await readFile(join(dir, 'ca.key'), 'utf8');

    // 1. A new CA in front of ca.crt, the old one kept; certificates unchanged.
    const step1 = await write(dir, 'new');
    assert.match(step1.join('\n'), /left as they were/);
    assert.equal(pemCertificates(await readFile(join(dir, 'ca.crt'))).length, 2);
    assert.notEqual(await readFile(join(dir, 'ca.key'), 'utf8'), oldCaKey);
    const trustingBoth = await snapshot(dir, 'manager');
    await handshake(trustingBoth, original);
    await handshake(original, trustingBoth);

    // 2. Certificates signed by the new CA; pods of step 1 trust it already.
    await write(dir);
    const resigned = await snapshot(dir, 'peer');
    await handshake(resigned, trustingBoth);
    await handshake(trustingBoth, resigned);
    await assert.rejects(
      handshake(resigned, original),
      'a pod that never trusted the new CA would refuse it: that is why step 1 rolls first',
    );

    // 3. The old CA dropped; the pods of step 2 and 3 still talk, the old certificate no longer loads.
    const step3 = await write(dir, 'retire');
    assert.match(step3.join('\n'), /dropped 1 older/);
    assert.equal(pemCertificates(await readFile(join(dir, 'ca.crt'))).length, 1);
    const retired = await snapshot(dir, 'scheduler');
    await handshake(retired, resigned);
    await handshake(resigned, retired);
    const stale = join(dir, 'stale.crt');
    await writeFile(stale, original.cert);
    await copyFile(join(dir, 'ca.crt'), join(dir, 'now-ca.crt'));
    assert.throws(
      () => loadTls({ cert: stale, key: join(dir, 'manager.key'), ca: join(dir, 'now-ca.crt') }),
      /not signed by the CA|does not go with/,
    );
  });

  it('refuses to retire the old CA while a certificate is still signed by it, naming the certificate', async () => {
    const dir = await folder();
    await write(dir);
    await write(dir, 'new');
    const ca = await readFile(join(dir, 'ca.crt'), 'utf8');
    await assert.rejects(write(dir, 'retire'), /manager\.crt is not signed by the newest CA .*run this without --retire-old-ca first/);
    assert.equal(await readFile(join(dir, 'ca.crt'), 'utf8'), ca, 'ca.crt untouched');
  });

  it('names what is wrong with the CA it is given, and changes no file', async () => {
    const dir = await folder();
    await write(dir);
    const other = await folder();
    await write(other);
    const files = async () => Promise.all(['ca.crt', ...COMPONENTS.map((c) => `${c}.crt`)].map((f) => readFile(join(dir, f), 'utf8')));
    const kept = await files();

    await copyFile(join(other, 'ca.key'), join(dir, 'ca.key'));
    await assert.rejects(write(dir), /ca\.key is not the key of the CA certificate in .*ca\.crt/);
    await writeFile(
      join(dir, 'ca.key'),
      generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ type: 'pkcs8', format: 'pem' }),
    );
    await assert.rejects(write(dir), /ca\.key is not an ECDSA P-256 key/);
    await writeFile(join(dir, 'ca.key'), 'not a key');
    await assert.rejects(write(dir), /ca\.key is not a PEM private key/);
    await copyFile(join(dir, 'peer.crt'), join(dir, 'ca.crt'));
    await copyFile(join(other, 'ca.key'), join(dir, 'ca.key'));
    await assert.rejects(write(dir), /ca\.crt is not a CA certificate/);
    await copyFile(join(other, 'ca.crt'), join(dir, 'ca.crt'));
    await rm(join(dir, 'ca.key'));
    await assert.rejects(write(dir), /ca\.crt is there but .*ca\.key is not: put the CA's key back/);
    assert.deepEqual((await files()).slice(1), kept.slice(1), 'the certificates were not replaced');
  });

  it('as a command: writes the files, and refuses bad flags with exit 2 and a message', async () => {
    const dir = await folder();
    const made = await run(process.execPath, [STARLING_CLI, 'certs', '--out', dir, '--namespace', 'p2p', '--days', '90']);
    assert.equal(made.code, 0, made.stderr);
    assert.match(made.stdout, /peer\.crt, peer\.key: CN=starling-peer/);
    assert.match(new X509Certificate(await readFile(join(dir, 'manager.crt'))).subjectAltName ?? '', /DNS:starling-manager\.p2p\.svc\b/);
    for (const [args, message] of [
      [['--days', '0'], /--days must be a whole number of days/],
      [['--namespace', 'Not_A_Namespace'], /--namespace Not_A_Namespace is not a Kubernetes namespace name/],
      [['--new-ca', '--retire-old-ca'], /--new-ca and --retire-old-ca are steps of their own/],
    ] as const) {
      const refused = await run(process.execPath, [STARLING_CLI, 'certs', '--out', dir, ...args]);
      assert.equal(refused.code, 2, refused.stderr);
      assert.match(refused.stderr, message);
    }
  });
});

/** A TLS handshake from `client` to a server presenting `server`'s files, as components do it: the client checks the chain (not the name); servers ask no certificate. */
async function handshake(server: ClusterTls, client: ClusterTls): Promise<void> {
  const listener = tls.createServer(serverTlsOptions(server), (socket) => socket.end('ok'));
  await new Promise<void>((resolve) => listener.listen(0, '127.0.0.1', resolve));
  try {
    await new Promise<void>((resolve, reject) => {
      const socket = tls.connect({ host: '127.0.0.1', port: (listener.address() as AddressInfo).port, ...clientTlsOptions(client) }, () => {
        socket.end();
        resolve();
      });
      socket.on('error', reject);
    });
  } finally {
    listener.close();
  }
}
