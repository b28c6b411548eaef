// TLS files on disk. `starling up` keeps a cluster token and one CA with one certificate
// (127.0.0.1, ::1, localhost) in its data directory, made at first start and reused after.
// `starling certs` keeps a CA and a certificate per component in a folder that Kubernetes
// Secrets are made from (deploy/kubernetes), and replaces them in the steps that keep a
// running cluster talking (README, "Install on Kubernetes").
import { X509Certificate, randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { UserError } from './errors.js';
import { createAuthority, issueLeaf, loadAuthority, type LeafNames } from './tls-issue.js';
import { pemCertificates, type TlsFiles } from './tls.js';

/** A CA lives ten years, a leaf (by default) one: replacing leaves is routine, replacing a CA is not. */
const CA_DAYS = 3650;
const UP_LEAF_DAYS = 730;

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
export async function issueClusterCertificates(names: {
  dns: string[];
  ips: string[];
}): Promise<{ ca: string; cert: string; key: string }> {
  const authority = await createAuthority(CA_DAYS);
  const leaf = await issueLeaf(authority, { commonName: 'starling', ...names }, UP_LEAF_DAYS);
  return { ca: authority.cert, ...leaf };
}

/**
 * What `starling certs` does to the CA in its folder:
 * - `keep`: use the CA there (the first certificate of ca.crt, and ca.key), or make one if there is
 *   none, and sign a new certificate for every component. Old and new leaves chain to the same CA,
 *   so pods of both kinds keep talking while they roll.
 * - `new`: make a new CA and put it in front of ca.crt, keeping the old ones after it; leaves are
 *   left as they are. Once every pod trusts both, `keep` signs the leaves with the new CA.
 * - `retire`: cut ca.crt to its first CA, once every leaf is signed by it.
 */
export type CaStep = 'keep' | 'new' | 'retire';

export interface ClusterCertificateOptions {
  /** Each component's file name (`<name>.crt`, `<name>.key`) and what its certificate names. */
  leaves: Record<string, LeafNames>;
  /** How long new leaves are valid. */
  days: number;
  ca: CaStep;
}

/** Writes the CA and the components' certificates in `dir` (see CaStep); returns what it did, a line each. */
export async function writeClusterCertificates(dir: string, options: ClusterCertificateOptions): Promise<string[]> {
  const where = { cert: join(dir, 'ca.crt'), key: join(dir, 'ca.key') };
  const haveCert = existsSync(where.cert);
  const haveKey = existsSync(where.key);
  if (haveCert !== haveKey) {
    throw new UserError(
      haveCert
        ? `${where.cert} is there but ${where.key} is not: put the CA's key back (it signs the new certificates), or move ${where.cert} away to start a new CA`
        : `${where.key} is there but ${where.cert} is not: put the CA's certificate back, or move ${where.key} away to start a new CA`,
    );
  }
  await mkdir(dir, { recursive: true });
  const done: string[] = [];
  if (!haveCert) {
    // A first run (whatever the step): a CA, then every leaf.
    const authority = await createAuthority(CA_DAYS);
    await writeAtomically(where.key, authority.key, 0o600);
    await writeAtomically(where.cert, authority.cert, 0o644);
    done.push(
      `${where.cert}, ${where.key}: a new CA, ${describe(authority.cert)} (keep ca.key safe: it signs every certificate of the cluster)`,
    );
    done.push(...(await writeLeaves(dir, authority.cert, authority.key, options)));
    return done;
  }
  const bundle = await readFile(where.cert, 'utf8');
  const cas = pemCertificates(Buffer.from(bundle));
  if (options.ca === 'new') {
    const authority = await createAuthority(CA_DAYS);
    await writeAtomically(where.key, authority.key, 0o600);
    await writeAtomically(where.cert, [authority.cert, ...cas.map((pem) => `${pem}\n`)].join(''), 0o644);
    done.push(
      `${where.cert}: a new CA, ${describe(authority.cert)}, in front of the ${cas.length} it held; ${where.key} is the new CA's key`,
    );
    done.push(
      "the components' certificates are left as they were: once every pod trusts both CAs, run this again without --new-ca to sign them with the new one",
    );
    return done;
  }
  if (options.ca === 'retire') {
    const current = cas[0];
    if (!current) throw new UserError(`${where.cert} holds no PEM certificate`);
    const authority = new X509Certificate(current);
    for (const name of Object.keys(options.leaves)) {
      const file = join(dir, `${name}.crt`);
      if (!existsSync(file)) continue;
      if (!new X509Certificate(await readFile(file)).verify(authority.publicKey)) {
        throw new UserError(
          `${file} is not signed by the newest CA in ${where.cert}: run this without --retire-old-ca first (and roll the pods), then retire the old CA`,
        );
      }
    }
    if (cas.length === 1) {
      done.push(`${where.cert} holds one CA already: nothing to retire`);
      return done;
    }
    await writeAtomically(where.cert, `${current}\n`, 0o644);
    done.push(`${where.cert}: kept ${describe(current)}, dropped ${cas.length - 1} older`);
    return done;
  }
  done.push(...(await writeLeaves(dir, bundle, await readFile(where.key, 'utf8'), options, where)));
  return done;
}

/** A new certificate and key for every component, signed by the CA (the first of `caBundle`). */
async function writeLeaves(
  dir: string,
  caBundle: string,
  caKey: string,
  options: ClusterCertificateOptions,
  where = { cert: join(dir, 'ca.crt'), key: join(dir, 'ca.key') },
): Promise<string[]> {
  const authority = await loadAuthority(caBundle, caKey, where);
  const done: string[] = [];
  for (const [name, names] of Object.entries(options.leaves)) {
    const leaf = await issueLeaf(authority, names, options.days);
    // The key first: a run cut short leaves a certificate with the key of another, which every
    // component names at start (loadTls), never a key nobody can match.
    await writeAtomically(join(dir, `${name}.key`), leaf.key, 0o600);
    await writeAtomically(join(dir, `${name}.crt`), leaf.cert, 0o644);
    done.push(`${join(dir, `${name}.crt`)}, ${name}.key: ${describe(leaf.cert)}`);
  }
  return done;
}

/** "CN=…, valid until …" of a PEM certificate. */
function describe(pem: string): string {
  const cert = new X509Certificate(pem);
  return `${cert.subject.replace(/\n/g, ', ')}, valid until ${new Date(cert.validTo).toISOString().slice(0, 10)}`;
}

/** Writes `file` through a temporary file and a rename: a reader sees the old content or the new. */
async function writeAtomically(file: string, content: string, mode: number): Promise<void> {
  const temporary = `${file}.${process.pid}.tmp`;
  await writeFile(temporary, content, { mode });
  await chmod(temporary, mode);
  await rename(temporary, file);
}
