// Making the cluster's certificates: a CA and the leaf certificates it signs, all PEM. `starling up`
// makes a CA and one leaf for itself (tls-files.ts); `starling certs` makes a CA and a leaf per
// component for Kubernetes Secrets, and signs new leaves with a CA it made before.
//
// Keys are ECDSA P-256: small, fast to handshake, and what WebCrypto signs with everywhere.
// Leaves carry serverAuth and clientAuth: every component is a server to some and a client of others.
import 'reflect-metadata';
import { X509Certificate as NodeX509Certificate, createPrivateKey, randomBytes, webcrypto } from 'node:crypto';
import * as x509 from '@peculiar/x509';
import { UserError } from './errors.js';
import { pemCertificates } from './tls.js';

x509.cryptoProvider.set(webcrypto as unknown as Crypto);

const ALGORITHM = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
const DAY_MS = 24 * 3600 * 1000;
/** Issued certificates start a minute back, for clocks a little behind the issuer's. */
const CLOCK_SKEW_MS = 60_000;

/** A CA that can sign: its certificate and key in PEM, and the key ready for WebCrypto. */
export interface Authority {
  cert: string;
  key: string;
  certificate: x509.X509Certificate;
  signingKey: CryptoKey;
}

/** What a leaf certificate names: its common name and the DNS names and IP addresses it is for. */
export interface LeafNames {
  commonName: string;
  dns: string[];
  ips: string[];
}

/**
 * A new self-signed CA, valid for `days`. Its name carries its serial: while a bundle holds an old
 * and a new CA, a chain is built by name (and key id), so two CAs must not share one.
 */
export async function createAuthority(days: number): Promise<Authority> {
  const now = Date.now();
  const serial = serialNumber();
  const keys = await webcrypto.subtle.generateKey(ALGORITHM, true, ['sign', 'verify']);
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: serial,
    name: `CN=Starling cluster CA ${serial.slice(0, 8)}`,
    notBefore: new Date(now - CLOCK_SKEW_MS),
    notAfter: new Date(now + days * DAY_MS),
    signingAlgorithm: ALGORITHM,
    keys,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  return { cert: `${cert.toString('pem')}\n`, key: await privateKeyPem(keys.privateKey), certificate: cert, signingKey: keys.privateKey };
}

/**
 * A CA made before, from its PEM files: the first certificate in `certPem` (a bundle may follow it)
 * and its key. Only keys of the kind `createAuthority` makes are taken; the names are the files'.
 */
export async function loadAuthority(certPem: string, keyPem: string, where: { cert: string; key: string }): Promise<Authority> {
  const first = pemCertificates(Buffer.from(certPem))[0];
  if (!first) throw new UserError(`${where.cert} holds no PEM certificate`);
  const cert = new NodeX509Certificate(first);
  if (!cert.ca) throw new UserError(`${where.cert} is not a CA certificate (basic constraints say it may not sign others)`);
  let nodeKey;
  try {
    nodeKey = createPrivateKey(keyPem);
  } catch (error) {
    throw new UserError(`${where.key} is not a PEM private key: ${(error as Error).message}`);
  }
  if (nodeKey.asymmetricKeyType !== 'ec' || nodeKey.asymmetricKeyDetails?.namedCurve !== 'prime256v1') {
    throw new UserError(
      `${where.key} is not an ECDSA P-256 key (the kind starling certs makes); sign the leaves with your own tools instead`,
    );
  }
  if (!cert.checkPrivateKey(nodeKey)) throw new UserError(`${where.key} is not the key of the CA certificate in ${where.cert}`);
  if (Date.parse(cert.validTo) < Date.now()) throw new UserError(`the CA certificate in ${where.cert} expired on ${cert.validTo}`);
  const pkcs8 = nodeKey.export({ type: 'pkcs8', format: 'der' });
  const signingKey = await webcrypto.subtle.importKey('pkcs8', pkcs8, ALGORITHM, false, ['sign']);
  return { cert: `${first}\n`, key: keyPem, certificate: new x509.X509Certificate(first), signingKey };
}

/** A leaf certificate signed by `authority`, valid for `days` (never past the CA's own end). */
export async function issueLeaf(authority: Authority, names: LeafNames, days: number): Promise<{ cert: string; key: string }> {
  const now = Date.now();
  const caEnd = authority.certificate.notAfter.getTime();
  const keys = await webcrypto.subtle.generateKey(ALGORITHM, true, ['sign', 'verify']);
  const alternativeNames = [
    ...names.dns.map((value) => ({ type: 'dns' as const, value })),
    ...names.ips.map((value) => ({ type: 'ip' as const, value })),
  ];
  const leaf = await x509.X509CertificateGenerator.create({
    serialNumber: serialNumber(),
    subject: `CN=${names.commonName}`,
    issuer: authority.certificate.subject,
    notBefore: new Date(now - CLOCK_SKEW_MS),
    notAfter: new Date(Math.min(now + days * DAY_MS, caEnd)),
    signingAlgorithm: ALGORITHM,
    publicKey: keys.publicKey,
    signingKey: authority.signingKey,
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature | x509.KeyUsageFlags.keyEncipherment, true),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth, x509.ExtendedKeyUsage.clientAuth]),
      await authorityKeyIdentifier(authority.certificate),
      ...(alternativeNames.length ? [new x509.SubjectAlternativeNameExtension(alternativeNames)] : []),
    ],
  });
  return { cert: `${leaf.toString('pem')}\n`, key: await privateKeyPem(keys.privateKey) };
}

/** The CA's own key identifier when it states one (another tool may compute it otherwise), else one from its key. */
async function authorityKeyIdentifier(ca: x509.X509Certificate): Promise<x509.AuthorityKeyIdentifierExtension> {
  const stated = ca.getExtension(x509.SubjectKeyIdentifierExtension);
  return stated ? new x509.AuthorityKeyIdentifierExtension(stated.keyId) : x509.AuthorityKeyIdentifierExtension.create(ca.publicKey);
}

async function privateKeyPem(key: CryptoKey): Promise<string> {
  const pkcs8 = Buffer.from(await webcrypto.subtle.exportKey('pkcs8', key)).toString('base64');
  return `-----BEGIN PRIVATE KEY-----\n${pkcs8.replace(/(.{64})/g, '$1\n').replace(/\n?$/, '\n')}-----END PRIVATE KEY-----\n`;
}

/** A positive 64-bit serial (the first byte's high bit clear: DER would read it as negative). */
function serialNumber(): string {
  const bytes = randomBytes(8);
  bytes.writeUInt8(bytes.readUInt8(0) & 0x7f, 0);
  return bytes.toString('hex');
}
