// The cluster token and TLS files `starling up` keeps in its data directory, made at first start
// and reused after: a CA of its own and one certificate (127.0.0.1, ::1, localhost) that every
// component of the one-machine cluster presents. Operators of real clusters bring their own
// (Kubernetes Secrets, cert-manager) through --tls-cert, --tls-key and --tls-ca.
import 'reflect-metadata';
import { randomBytes, webcrypto } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import * as x509 from '@peculiar/x509';
import type { TlsFiles } from './tls.js';

x509.cryptoProvider.set(webcrypto as unknown as Crypto);

const ALGORITHM = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
const YEAR_MS = 365 * 24 * 3600 * 1000;

/** Writes a cluster token (48 hex characters) at `file` unless one is there; returns the file. */
export async function ensureClusterToken(file: string): Promise<string> {
  if (!existsSync(file)) {
    await writeFile(file, `${randomBytes(24).toString('hex')}\n`, { mode: 0o600 });
  }
  return file;
}

/**
 * Makes `dir`/ca.pem, cert.pem and key.pem unless they exist: a CA valid for ten years and a
 * certificate it signs, valid for two, for the names and addresses given. The CA's key is not
 * kept: nothing else is ever signed with it.
 */
export async function ensureTlsFiles(dir: string, names: { dns: string[]; ips: string[] }): Promise<TlsFiles> {
  const files = { ca: join(dir, 'ca.pem'), cert: join(dir, 'cert.pem'), key: join(dir, 'key.pem') };
  if (existsSync(files.ca) && existsSync(files.cert) && existsSync(files.key)) return files;
  await mkdir(dir, { recursive: true });
  const issued = await issueClusterCertificates(names);
  await writeFile(files.ca, issued.ca);
  await writeFile(files.cert, issued.cert);
  await writeFile(files.key, issued.key, { mode: 0o600 });
  await chmod(files.key, 0o600);
  return files;
}

/** A new CA and one leaf certificate it signed, all PEM. */
export async function issueClusterCertificates(names: { dns: string[]; ips: string[] }): Promise<{ ca: string; cert: string; key: string }> {
  const now = Date.now();
  const caKeys = await webcrypto.subtle.generateKey(ALGORITHM, true, ['sign', 'verify']);
  const ca = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: randomBytes(8).toString('hex'),
    name: 'CN=Starling cluster CA',
    notBefore: new Date(now - 60_000),
    notAfter: new Date(now + 10 * YEAR_MS),
    signingAlgorithm: ALGORITHM,
    keys: caKeys,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
    ],
  });
  const leafKeys = await webcrypto.subtle.generateKey(ALGORITHM, true, ['sign', 'verify']);
  const leaf = await x509.X509CertificateGenerator.create({
    serialNumber: randomBytes(8).toString('hex'),
    subject: 'CN=starling',
    issuer: ca.subject,
    notBefore: new Date(now - 60_000),
    notAfter: new Date(now + 2 * YEAR_MS),
    signingAlgorithm: ALGORITHM,
    publicKey: (leafKeys).publicKey,
    signingKey: (caKeys).privateKey,
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature | x509.KeyUsageFlags.keyEncipherment, true),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth, x509.ExtendedKeyUsage.clientAuth]),
      new x509.SubjectAlternativeNameExtension([...names.dns.map((value) => ({ type: 'dns' as const, value })), ...names.ips.map((value) => ({ type: 'ip' as const, value }))]),
    ],
  });
  const pkcs8 = await webcrypto.subtle.exportKey('pkcs8', (leafKeys).privateKey);
  const key = `-----BEGIN PRIVATE KEY-----\n${Buffer.from(pkcs8).toString('base64').replace(/(.{64})/g, '$1\n').replace(/\n?$/, '\n')}-----END PRIVATE KEY-----\n`;
  return { ca: ca.toString('pem') + '\n', cert: leaf.toString('pem') + '\n', key };
}
