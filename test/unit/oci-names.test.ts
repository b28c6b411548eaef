import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { digestOf, parseDigest } from '../../src/oci/digest.js';
import { explainBadRepositoryName, isRepositoryName, isTag } from '../../src/oci/names.js';
import { parseImageReference } from '../../src/oci/reference.js';
import { isRegistryHost } from '../../src/oci/registry-hosts.js';

describe('digests', () => {
  it('accepts sha256 and sha512', () => {
    const d = digestOf('hello');
    assert.equal(parseDigest(d).algorithm, 'sha256');
    assert.equal(parseDigest(digestOf('x', 'sha512')).hex.length, 128);
  });
  it('names what is wrong with a bad digest', () => {
    assert.throws(() => parseDigest('sha256:abc'), /expected 64 lowercase hex/);
    assert.throws(() => parseDigest(`sha256:${'A'.repeat(64)}`), /lowercase hex/);
    assert.throws(() => parseDigest(`md5:${'a'.repeat(32)}`), /unsupported digest algorithm "md5"/);
    assert.throws(() => parseDigest('nocolon'), /malformed digest/);
    assert.throws(() => parseDigest('sha256:../../etc'), /malformed digest/);
  });
});

describe('repository names and tags', () => {
  it('follows the distribution grammar', () => {
    for (const good of ['a', 'library/busybox', 'a.b/c_d/e__f/g-h--i', 'x9/y8']) assert.ok(isRepositoryName(good), good);
    for (const bad of ['', 'A', 'a//b', '/a', 'a/', 'a/../b', '..', 'a/./b', 'a..b', 'a b', 'a%2fb']) {
      assert.ok(!isRepositoryName(bad), bad);
    }
    assert.match(explainBadRepositoryName('a/../b') ?? '', /"\." or "\.\." path component/);
    assert.match(explainBadRepositoryName('x'.repeat(300)) ?? '', /longer than 255/);
    assert.ok(isTag('v1.0_rc-1'));
    assert.ok(!isTag('.hidden'));
    assert.ok(!isTag('x'.repeat(129)));
  });
  it('recognizes registry hosts and nothing that reshapes a URL', () => {
    for (const good of ['127.0.0.1:5000', 'docker.io', 'registry.example.com', 'localhost:5000', '[::1]:5000']) {
      assert.ok(isRegistryHost(good), good);
    }
    for (const bad of ['', 'a/b', 'user@host', 'host:port', 'http://x', 'a b', 'host:5000/path']) assert.ok(!isRegistryHost(bad), bad);
  });
});

describe('image references', () => {
  it('parses the way Docker does', () => {
    assert.deepEqual(parseImageReference('busybox'), {
      registry: 'docker.io',
      repository: 'library/busybox',
      tag: 'latest',
      digest: undefined,
    });
    assert.deepEqual(parseImageReference('127.0.0.1:5000/a/b:v1'), {
      registry: '127.0.0.1:5000',
      repository: 'a/b',
      tag: 'v1',
      digest: undefined,
    });
    const d = digestOf('x');
    assert.deepEqual(parseImageReference(`localhost/x@${d}`), { registry: 'localhost', repository: 'x', tag: undefined, digest: d });
  });
  it('names the problem in a bad reference', () => {
    assert.throws(() => parseImageReference(''), /empty/);
    assert.throws(() => parseImageReference('r.io/a/../b:1'), /path component/);
    assert.throws(() => parseImageReference('r.io/a@sha256:zz'), /malformed/);
    assert.throws(() => parseImageReference('r.io/a:.bad'), /invalid tag/);
  });
});
