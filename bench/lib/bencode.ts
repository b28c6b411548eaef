// Just enough bencode to read a .torrent: the BitTorrent info hash is the SHA-1 of the
// exact bytes of the top-level dictionary's "info" value.

import { createHash } from 'node:crypto';

/** End offset (exclusive) of the bencoded value starting at `pos`. */
function skip(buf: Buffer, pos: number): number {
  const c = buf[pos];
  if (c === undefined) throw new Error('bencode: truncated');
  if (c === 0x69 /* i */) {
    const end = buf.indexOf(0x65 /* e */, pos);
    if (end < 0) throw new Error('bencode: unterminated integer');
    return end + 1;
  }
  if (c === 0x6c /* l */ || c === 0x64 /* d */) {
    let p = pos + 1;
    while (buf[p] !== 0x65) {
      if (p >= buf.length) throw new Error('bencode: unterminated list/dict');
      p = skip(buf, p);
    }
    return p + 1;
  }
  if (c >= 0x30 && c <= 0x39) {
    const colon = buf.indexOf(0x3a /* : */, pos);
    if (colon < 0) throw new Error('bencode: bad string length');
    const len = Number(buf.subarray(pos, colon).toString('ascii'));
    return colon + 1 + len;
  }
  throw new Error(`bencode: unexpected byte 0x${c.toString(16)} at ${pos}`);
}

function readString(buf: Buffer, pos: number): [string, number] {
  const colon = buf.indexOf(0x3a, pos);
  const len = Number(buf.subarray(pos, colon).toString('ascii'));
  return [buf.subarray(colon + 1, colon + 1 + len).toString('latin1'), colon + 1 + len];
}

/** Hex SHA-1 info hash of a .torrent file's contents. */
export function infoHash(torrent: Buffer): string {
  if (torrent[0] !== 0x64) throw new Error('not a torrent: top level is not a dictionary');
  let p = 1;
  while (torrent[p] !== 0x65) {
    const [key, valueStart] = readString(torrent, p);
    const valueEnd = skip(torrent, valueStart);
    if (key === 'info') return createHash('sha1').update(torrent.subarray(valueStart, valueEnd)).digest('hex');
    p = valueEnd;
  }
  throw new Error('not a torrent: no info dictionary');
}
