import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { issueClusterCertificates } from '../../src/common/tls-files.js';
import { loadTls, tlsFlags } from '../../src/common/tls.js';

describe('TLS files', () => {
  let dir: string;
  const file = (name: string) => join(dir, name);

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'starling-tls-unit-'));
    const names = { dns: ['localhost'], ips: ['127.0.0.1'] };
    for (const [prefix, issued] of [
      ['a', await issueClusterCertificates(names)],
      ['b', await issueClusterCertificates(names)],
    ] as const) {
      await writeFile(file(`${prefix}-ca.pem`), issued.ca);
      await writeFile(file(`${prefix}-cert.pem`), issued.cert);
      await writeFile(file(`${prefix}-key.pem`), issued.key);
    }
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('loads a certificate, its key and the CA that signed it', () => {
    const tls = loadTls({ cert: file('a-cert.pem'), key: file('a-key.pem'), ca: file('a-ca.pem') });
    assert.ok(tls?.cert.length && tls.key.length && tls.ca.length);
  });

  it('names the file that does not fit: a key of another certificate, a certificate of another CA', () => {
    assert.throws(
      () => loadTls({ cert: file('a-cert.pem'), key: file('b-key.pem'), ca: file('a-ca.pem') }),
      /TLS key .*b-key\.pem does not go with .*a-cert\.pem/,
    );
    assert.throws(
      () => loadTls({ cert: file('a-cert.pem'), key: file('a-key.pem'), ca: file('b-ca.pem') }),
      /TLS certificate .*a-cert\.pem is not signed by the CA in .*b-ca\.pem/,
    );
    assert.throws(() => loadTls({ cert: file('a-key.pem'), key: file('a-key.pem'), ca: file('a-ca.pem') }), /is not a PEM certificate/);
  });

  it('takes the three flags together or not at all', () => {
    assert.equal(tlsFlags({}), undefined);
    assert.deepEqual(tlsFlags({ tlsCert: 'c', tlsKey: 'k', tlsCa: 'a' }), { cert: 'c', key: 'k', ca: 'a' });
    assert.throws(() => tlsFlags({ tlsCa: 'a' }), /missing --tls-cert, --tls-key/);
  });
});
