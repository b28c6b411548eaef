import assert from 'node:assert/strict';
import { test } from 'node:test';
import { gunzipSync } from 'node:zlib';
import { EstargzError, encodeFooter, parseAnyFooter, parseFooter, parseLegacyFooter, FOOTER_SIZE } from '../../src/estargz/index.js';

// Bytes written by Go's gzipFooterBytes(0x31142) (captured from a Go-built blob): the exact layout.
const GO_FOOTER_HEX = '1f8b0804000000000' + '0ff1a00534716003030303030303030303030333131343253544152475a010000ffff0000000000000000';

test('encodeFooter reproduces the Go footer byte for byte', () => {
  const footer = encodeFooter(0x31142);
  assert.equal(footer.length, FOOTER_SIZE);
  assert.equal(footer.toString('hex'), GO_FOOTER_HEX);
});

test('the footer is an empty gzip member and parses back', () => {
  for (const offset of [0, 1, 0x31142, 2 ** 40 + 7, Number.MAX_SAFE_INTEGER]) {
    const footer = encodeFooter(offset);
    assert.equal(gunzipSync(footer).length, 0);
    assert.deepEqual(parseFooter(footer), { format: 'gzip', tocOffset: offset, size: 51, payloadEnd: offset });
    assert.deepEqual(parseAnyFooter(Buffer.concat([Buffer.from('prefix'), footer])), {
      format: 'gzip',
      tocOffset: offset,
      size: 51,
      payloadEnd: offset,
    });
  }
});

/** The legacy footer: Extra field is the 22-byte payload itself. */
function legacyFooter(offset: number): Buffer {
  const footer = Buffer.alloc(47);
  footer.set([0x1f, 0x8b, 0x08, 0x04, 0, 0, 0, 0, 0, 0xff], 0);
  footer.writeUInt16LE(22, 10);
  footer.write(offset.toString(16).padStart(16, '0') + 'STARGZ', 12, 'latin1');
  footer.set([0x01, 0x00, 0x00, 0xff, 0xff], 34);
  return footer;
}

test('legacy 47-byte footers are accepted, as Go does', () => {
  const footer = legacyFooter(0xabc);
  assert.equal(gunzipSync(footer).length, 0);
  assert.deepEqual(parseLegacyFooter(footer), { format: 'gzip', tocOffset: 0xabc, size: 47, payloadEnd: 0xabc });
  assert.deepEqual(parseAnyFooter(Buffer.concat([Buffer.alloc(10), footer])), {
    format: 'gzip',
    tocOffset: 0xabc,
    size: 47,
    payloadEnd: 0xabc,
  });
});

test('forged footers are refused with a message naming the problem', () => {
  const cases: [string, (f: Buffer) => void, RegExp][] = [
    ['bad magic', (f) => (f[0] = 0x00), /bad magic/],
    ['not deflate', (f) => (f[2] = 0x07), /not deflate/],
    ['no FEXTRA', (f) => (f[3] = 0x00), /FEXTRA/],
    ['subfield id', (f) => (f[12] = 0x41), /"SG"/],
    ['subfield length', (f) => f.writeUInt16LE(21, 14), /subfield length/],
    ['magic', (f) => f.write('STARGY', 32, 'latin1'), /STARGZ magic/],
    ['non-hex offset', (f) => f.write('00000000000zz000', 16, 'latin1'), /16 hex digits/],
    ['signed offset', (f) => f.write('-000000000000001', 16, 'latin1'), /16 hex digits/],
    ['xlen too big', (f) => f.writeUInt16LE(60, 10), /Extra/],
  ];
  for (const [label, mutate, message] of cases) {
    const footer = encodeFooter(1234);
    mutate(footer);
    assert.throws(
      () => parseFooter(footer),
      (e: unknown) => e instanceof EstargzError && e.code === 'FOOTER' && message.test(e.message),
      label,
    );
    assert.throws(() => parseAnyFooter(footer), EstargzError, label);
  }
  assert.throws(() => parseAnyFooter(Buffer.alloc(20)), /smaller than a 51-byte footer/);
  assert.throws(() => parseFooter(Buffer.alloc(50)), /must be 51 bytes/);
  assert.throws(() => parseFooter(encodeFooter(0).fill(0x66, 16, 32)), /too large/);
});
