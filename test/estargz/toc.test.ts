import assert from 'node:assert/strict';
import { test } from 'node:test';
import { EstargzError, indexToc, parseTocJson, serializeToc, type Toc } from '../../src/estargz/index.js';
import { goQuote } from '../../src/estargz/go-json.js';

const D = (c: string) => `sha256:${c.repeat(64)}`;

test('strings are escaped the way Go 1.19 encoding/json escapes them', () => {
  assert.equal(goQuote('plain/ascii.txt'), '"plain/ascii.txt"');
  assert.equal(goQuote('a<b>&c'), '"a\\u003cb\\u003e\\u0026c"');
  assert.equal(goQuote('q"\\'), '"q\\"\\\\"');
  assert.equal(goQuote('\n\r\t\b\f\x01\x1f'), '"\\n\\r\\t\\u0008\\u000c\\u0001\\u001f"');
  assert.equal(goQuote('\u2028\u2029'), '"\\u2028\\u2029"');
  assert.equal(goQuote('ünï 😀'), '"ünï 😀"');
  assert.equal(goQuote('lone \ud800 surrogate'), '"lone \\ufffd surrogate"');
});

test('serializeToc writes Go field order, omits empty fields, tab indentation, base64 xattrs sorted', () => {
  const toc: Toc = {
    version: 1,
    entries: [
      { name: 'a/', type: 'dir', mode: 0o755, uid: 0, userName: '', modtime: '2023-05-06T07:08:09Z' },
      {
        name: 'a/f',
        type: 'reg',
        size: 3,
        offset: 99,
        digest: D('1'),
        chunkDigest: D('1'),
        mode: 0o644,
        xattrs: { 'user.z': Buffer.from('z'), 'user.a': Buffer.from([0, 255]) },
      },
    ],
  };
  const expected = [
    '{',
    '\t"version": 1,',
    '\t"entries": [',
    '\t\t{',
    '\t\t\t"name": "a/",',
    '\t\t\t"type": "dir",',
    '\t\t\t"modtime": "2023-05-06T07:08:09Z",',
    '\t\t\t"mode": 493',
    '\t\t},',
    '\t\t{',
    '\t\t\t"name": "a/f",',
    '\t\t\t"type": "reg",',
    '\t\t\t"size": 3,',
    '\t\t\t"mode": 420,',
    '\t\t\t"offset": 99,',
    '\t\t\t"xattrs": {',
    '\t\t\t\t"user.a": "AP8=",',
    '\t\t\t\t"user.z": "eg=="',
    '\t\t\t},',
    `\t\t\t"digest": "${D('1')}",`,
    `\t\t\t"chunkDigest": "${D('1')}"`,
    '\t\t}',
    '\t]',
    '}',
  ].join('\n');
  const json = serializeToc(toc);
  assert.equal(json.toString(), expected);
  assert.deepEqual(parseTocJson(json), {
    version: 1,
    entries: [
      { name: 'a/', type: 'dir', modtime: '2023-05-06T07:08:09Z', mode: 493 },
      {
        name: 'a/f',
        type: 'reg',
        size: 3,
        mode: 420,
        offset: 99,
        digest: D('1'),
        chunkDigest: D('1'),
        xattrs: { 'user.a': Buffer.from([0, 255]), 'user.z': Buffer.from('z') },
      },
    ],
  });
});

function tocError(json: string, code: string, message: RegExp) {
  assert.throws(
    () => indexToc(parseTocJson(Buffer.from(json)), 1000),
    (e: unknown) => e instanceof EstargzError && e.code === code && message.test(e.message),
    json.slice(0, 200),
  );
}

const toc = (...entries: object[]) => JSON.stringify({ version: 1, entries });
const reg = (name: string, extra: object = {}) => ({
  name,
  type: 'reg',
  size: 10,
  offset: 100,
  digest: D('a'),
  chunkDigest: D('a'),
  ...extra,
});

test('malformed TOC JSON is refused field by field', () => {
  tocError('{', 'TOC', /not valid JSON/);
  tocError('[]', 'TOC', /not an object/);
  tocError('{"version":2,"entries":[]}', 'TOC', /unsupported TOC version 2/);
  tocError('{"version":1,"entries":{}}', 'TOC', /not an array/);
  tocError(toc({ name: 'a', type: 'socket' }), 'ENTRY', /unknown type "socket"/);
  tocError(toc({ name: 7, type: 'dir' }), 'ENTRY', /"name" is not a string/);
  tocError(toc(reg('a', { size: -1 })), 'ENTRY', /"size" must be a non-negative integer/);
  tocError(toc(reg('a', { offset: 1.5 })), 'ENTRY', /"offset" must be a non-negative integer/);
  tocError(toc(reg('a', { digest: 'md5:abc' })), 'ENTRY', /invalid "digest"/);
  tocError(toc(reg('a', { chunkDigest: `sha512:${'0'.repeat(128)}` })), 'ENTRY', /only sha256/);
  tocError(toc({ name: 'a', type: 'dir', xattrs: { k: 'not base64!' } }), 'ENTRY', /xattr "k" is not base64/);
  tocError(toc({ name: 'a', type: 'symlink' }), 'ENTRY', /symlink without "linkName"/);
});

test('unsafe and duplicate names are refused', () => {
  tocError(toc({ name: '../etc/passwd', type: 'reg' }), 'UNSAFE_NAME', /contains "\.\."/);
  tocError(toc({ name: 'a/../../b', type: 'dir' }), 'UNSAFE_NAME', /contains "\.\."/);
  tocError(toc({ name: '/etc/shadow', type: 'reg' }), 'UNSAFE_NAME', /absolute entry name/);
  tocError(toc({ name: 'a/', type: 'dir' }, { name: './a', type: 'dir' }), 'DUPLICATE', /duplicate entry "a"/);
  tocError(toc({ name: './', type: 'reg' }), 'ENTRY', /root must be a directory/);
});

test('chunk layout is checked against the file and the TOC offset', () => {
  tocError(toc({ name: 'a', type: 'chunk', offset: 5, chunkOffset: 0, chunkDigest: D('b') }), 'CHUNK', /does not follow a regular file/);
  tocError(toc(reg('a', { chunkSize: 4 })), 'CHUNK', /chunks cover 4 of 10 bytes/);
  tocError(
    toc(reg('a', { chunkSize: 4 }), { type: 'chunk', offset: 200, chunkOffset: 5, chunkDigest: D('b') }),
    'CHUNK',
    /starts at 5, expected 4/,
  );
  tocError(
    toc(reg('a', { chunkSize: 4 }), { name: 'b', type: 'chunk', offset: 200, chunkOffset: 4, chunkDigest: D('b') }),
    'CHUNK',
    /different file/,
  );
  tocError(toc(reg('a', { chunkSize: 20 })), 'CHUNK', /exceeds file size 10/);
  tocError(toc(reg('a', { offset: 1000 })), 'CHUNK', /not before the TOC at 1000/);
  tocError(toc(reg('a'), reg('b')), 'CHUNK', /two chunks share data offset 100/);
  tocError(toc(reg('a', { digest: undefined, chunkDigest: undefined })), 'CHUNK', /no chunkDigest/);
  tocError(toc(reg('a', { chunkOffset: 3 })), 'CHUNK', /first chunk must start at 0/);
});

test('hardlinks must resolve, without cycles', () => {
  tocError(toc({ name: 'h', type: 'hardlink', linkName: 'missing' }), 'ENTRY', /points at missing "missing"/);
  tocError(
    toc({ name: 'h1', type: 'hardlink', linkName: 'h2' }, { name: 'h2', type: 'hardlink', linkName: 'h1' }),
    'ENTRY',
    /hardlink cycle/,
  );
  tocError(toc({ name: 'h', type: 'hardlink', linkName: '../x' }), 'UNSAFE_NAME', /contains "\.\."/);
});

test('a valid TOC is indexed: chunks, fetch ranges, inherited owner names, unchunked digests', () => {
  const index = indexToc(
    parseTocJson(
      Buffer.from(
        toc(
          { name: './', type: 'dir' },
          { name: 'a', type: 'reg', size: 10, offset: 100, chunkSize: 4, digest: D('f'), chunkDigest: D('1'), uid: 5, userName: 'five' },
          { name: 'a', type: 'chunk', offset: 300, chunkOffset: 4, chunkDigest: D('2') },
          { name: 'old', type: 'reg', size: 2, offset: 500, digest: D('3'), uid: 5 },
          { name: 'e', type: 'reg', digest: D('0') },
        ),
      ),
    ),
    900,
  );
  assert.deepEqual(
    index.entries.map((e) => e.name),
    ['', 'a', 'old', 'e'],
  );
  assert.deepEqual(
    index.chunks.map(({ offset, end, chunkOffset, chunkSize, digest }) => [offset, end, chunkOffset, chunkSize, digest]),
    [
      [100, 300, 0, 4, D('1')],
      [300, 500, 4, 6, D('2')],
      [500, 900, 0, 2, D('3')], // no chunkDigest: the whole-file digest verifies the single chunk
    ],
  );
  assert.equal(index.byName.get('old')?.userName, 'five');
  assert.equal(index.byName.get('e')?.chunks.length, 0);
});
