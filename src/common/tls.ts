// TLS between Starling's components (docs/security.md). Every component of a cluster is given
// the same three files: its certificate and key (what its servers present) and the cluster CA
// (what it checks the others' certificates against). Kubernetes Secrets or cert-manager provide
// them; `starling up` makes its own (tls-files.ts).
//
// Names are not checked, only the chain: peers are reached by the IP they announce, which a
// certificate issued before the pod was scheduled cannot know, and the cluster CA signs nothing
// but the cluster's own members. A rogue scheduler or peer without a certificate from that CA
// cannot complete a handshake with anyone.
import { readFileSync } from 'node:fs';
import { X509Certificate, createPrivateKey } from 'node:crypto';
import type { ConnectionOptions, SecureContextOptions } from 'node:tls';
import { z } from 'zod';
import { UserError } from './errors.js';

/** The config keys (and flags --tls-cert, --tls-key, --tls-ca) every component takes. */
export const tlsFilesSchema = z
  .object({
    /** PEM certificate (chain) this component's servers present. */
    cert: z.string().min(1),
    /** PEM private key of that certificate. */
    key: z.string().min(1),
    /** PEM certificate of the cluster CA (or several, while one replaces another): others' certificates must chain to one. */
    ca: z.string().min(1),
  })
  .strict();

export type TlsFiles = z.output<typeof tlsFilesSchema>;

/** The loaded files: the same for a component's servers and its clients. */
export interface ClusterTls {
  cert: Buffer;
  key: Buffer;
  ca: Buffer;
}

/** Alias for the side that connects: it trusts `ca` and may present `cert`. */
export type ClientTls = ClusterTls;

/** The --tls-cert, --tls-key and --tls-ca flags as commander parses them. */
export interface TlsFlags {
  tlsCert?: string;
  tlsKey?: string;
  tlsCa?: string;
}

/** Builds the tls section of a config from flags: all three or none, naming what is missing. */
export function tlsFlags(options: TlsFlags): TlsFiles | undefined {
  const given = { cert: options.tlsCert, key: options.tlsKey, ca: options.tlsCa };
  const missing = Object.entries(given)
    .filter(([, value]) => !value)
    .map(([name]) => `--tls-${name}`);
  if (missing.length === 3) return undefined;
  if (missing.length) throw new UserError(`TLS needs --tls-cert, --tls-key and --tls-ca together; missing ${missing.join(', ')}`);
  return given as TlsFiles;
}

/** Reads and checks the files, naming the one that is unreadable or not what it should be. */
export function loadTls(files: TlsFiles | undefined): ClusterTls | undefined {
  if (!files) return undefined;
  const read = (path: string, what: string): Buffer => {
    try {
      return readFileSync(path);
    } catch (error) {
      throw new UserError(`cannot read the TLS ${what} ${path}: ${(error as Error).message}`);
    }
  };
  const cert = read(files.cert, 'certificate');
  const key = read(files.key, 'key');
  const ca = read(files.ca, 'CA certificate');
  let leaf: X509Certificate;
  let authorities: X509Certificate[];
  try {
    leaf = new X509Certificate(cert);
  } catch (error) {
    throw new UserError(`TLS certificate ${files.cert} is not a PEM certificate: ${(error as Error).message}`);
  }
  try {
    // A bundle of several CAs is trusted whole: while a CA is replaced, the old and the new one.
    authorities = pemCertificates(ca).map((pem) => new X509Certificate(pem));
    if (!authorities.length) authorities = [new X509Certificate(ca)];
  } catch (error) {
    throw new UserError(`TLS CA certificate ${files.ca} is not a PEM certificate: ${(error as Error).message}`);
  }
  try {
    if (!leaf.checkPrivateKey(createPrivateKey(key))) throw new Error('it does not belong to the certificate');
  } catch (error) {
    throw new UserError(`TLS key ${files.key} does not go with ${files.cert}: ${(error as Error).message}`);
  }
  // The file may hold the chain: one of its certificates must be a CA's or signed by one.
  const chain = pemCertificates(cert).map((pem) => new X509Certificate(pem));
  const signedBy = (member: X509Certificate, authority: X509Certificate) => {
    try {
      return member.fingerprint256 === authority.fingerprint256 || member.verify(authority.publicKey);
    } catch {
      return false; // a key of another kind
    }
  };
  if (!chain.some((member) => authorities.some((authority) => signedBy(member, authority)))) {
    throw new UserError(`TLS certificate ${files.cert} is not signed by the CA in ${files.ca}`);
  }
  if (Date.parse(leaf.validTo) < Date.now()) throw new UserError(`TLS certificate ${files.cert} expired on ${leaf.validTo}`);
  return { cert, key, ca };
}

/** Each PEM certificate in a file's text, in order. */
export function pemCertificates(pem: Buffer): string[] {
  return pem.toString('latin1').match(/-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/g) ?? [];
}

/** Options for a TLS server of the cluster (node:https, tls). */
export function serverTlsOptions(tls: ClusterTls): SecureContextOptions {
  return { cert: tls.cert, key: tls.key, ca: tls.ca };
}

/** Options for a connection to a server of the cluster: the chain is checked, the name is not (see above). */
export function clientTlsOptions(tls: ClientTls): ConnectionOptions {
  return { ca: tls.ca, cert: tls.cert, key: tls.key, checkServerIdentity: () => undefined };
}

/** The scheme of a cluster-internal HTTP endpoint. */
export function httpScheme(tls: ClientTls | undefined): 'http' | 'https' {
  return tls ? 'https' : 'http';
}
