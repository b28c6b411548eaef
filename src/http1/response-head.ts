// An HTTP/1.1 response head, read strictly (RFC 9112). The peer reads heads from registries and
// from other peers, which can be anyone on the network: a head this module accepts is one whose
// framing no two readers could disagree on. Where RFC 9112 lets a recipient either repair or
// reject (bare LF, obs-fold, a repeated Content-Length), it rejects, except for a repeated
// Content-Length of one same value, which means one thing whichever way it is read.
import type { IncomingHttpHeaders } from 'node:http';

/** The answer is not a well-formed HTTP/1.1 response; the message says what it sent ("sent ..."). */
export class Http1ResponseError extends Error {
  override name = 'Http1ResponseError';
}

/** How the body after a head is delimited (RFC 9112 §6.3). */
export type Framing =
  /** No body (1xx, 204, 304). */
  | { kind: 'none' }
  | { kind: 'length'; length: number }
  | { kind: 'chunked' }
  /** Everything until the connection closes (no Content-Length, or a coding other than chunked last). */
  | { kind: 'until-close' };

export interface ResponseHead {
  status: number;
  /** Field names in lower case; repeated fields joined with ", " (set-cookie kept as a list). */
  headers: IncomingHttpHeaders;
  framing: Framing;
  /** The connection may carry another exchange after this one (HTTP/1.1 unless `connection: close`). */
  keepAlive: boolean;
}

const STATUS_LINE = /^HTTP\/1\.([01]) ([1-9]\d\d)(?: ([\t\x20-\x7e\x80-\xff]*))?$/;
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
/** A field value: visible characters, spaces and tabs (obs-text allowed); never CR, LF or NUL. */
const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;
const DIGITS = /^\d+$/;

/** A printable excerpt of what the server sent, for error messages. */
function quote(text: string): string {
  return JSON.stringify(text.length > 40 ? `${text.slice(0, 40)}…` : text);
}

/**
 * Where a head ends in `bytes` (the index of its blank line's CRLF CRLF), or -1 while it has not.
 * Throws on a head with a line ending in a bare LF, as soon as one arrives (RFC 9112 §2.2 lets a
 * recipient accept them; two readers that differ on it can be made to see two different messages).
 */
export function headEnd(bytes: Buffer): number {
  const end = bytes.indexOf('\r\n\r\n');
  const head = end < 0 ? bytes.length : end;
  for (let lf = bytes.indexOf(0x0a); lf >= 0 && lf < head; lf = bytes.indexOf(0x0a, lf + 1)) {
    if (bytes[lf - 1] !== 0x0d) throw new Http1ResponseError('sent a response head whose lines end in a bare LF, not CRLF');
  }
  return end;
}

/** Parses a response head: `text` is everything before its blank line, in latin1. */
export function parseResponseHead(text: string): ResponseHead {
  const lines = text.split('\r\n');
  const statusLine = lines[0] ?? '';
  const status = STATUS_LINE.exec(statusLine);
  if (!status) throw new Http1ResponseError(`sent no HTTP/1.x status line (${quote(statusLine)})`);
  const minor = status[1];
  const headers: IncomingHttpHeaders = {};
  const contentLengths: string[] = [];
  for (const line of lines.slice(1)) {
    if (/^[ \t]/.test(line)) throw new Http1ResponseError(`sent a folded header line (obs-fold, ${quote(line)})`);
    if (/[\r\n\0]/.test(line)) throw new Http1ResponseError(`sent a header line with a bare CR, LF or NUL (${quote(line)})`);
    const colon = line.indexOf(':');
    const name = colon < 0 ? '' : line.slice(0, colon);
    if (!TOKEN.test(name)) {
      throw new Http1ResponseError(
        colon < 0
          ? `sent a header line without a colon (${quote(line)})`
          : `sent a header line whose name is not a token (${quote(line)}; no space may precede the colon)`,
      );
    }
    const value = line.slice(colon + 1).replace(/^[ \t]+|[ \t]+$/g, '');
    if (!FIELD_VALUE.test(value)) throw new Http1ResponseError(`sent a control character in header ${name}`);
    const key = name.toLowerCase();
    if (key === 'content-length') contentLengths.push(...value.split(',').map((v) => v.trim()));
    const previous = headers[key];
    if (key === 'set-cookie') headers[key] = [...((previous as string[] | undefined) ?? []), value];
    else headers[key] = previous === undefined ? value : `${String(previous)}, ${value}`;
  }
  const code = Number(status[2]);
  const connection = String(headers.connection ?? '')
    .toLowerCase()
    .split(',')
    .map((token) => token.trim());
  const keepAlive = minor === '1' ? !connection.includes('close') : connection.includes('keep-alive');
  return { status: code, headers, framing: framing(code, headers, contentLengths), keepAlive };
}

/** RFC 9112 §6.3, for a response to a GET (the only method these clients send). */
function framing(status: number, headers: IncomingHttpHeaders, contentLengths: string[]): Framing {
  if (status < 200 || status === 204 || status === 304) return { kind: 'none' };
  const codings = headers['transfer-encoding'];
  if (codings !== undefined) {
    // Both: a message built to be read two ways (request smuggling); RFC 9112 §6.1 says to treat it as an error.
    if (contentLengths.length) throw new Http1ResponseError('sent both Transfer-Encoding and Content-Length');
    const last = String(codings).split(',').pop()?.trim().toLowerCase();
    return last === 'chunked' ? { kind: 'chunked' } : { kind: 'until-close' };
  }
  if (!contentLengths.length) return { kind: 'until-close' };
  const first = contentLengths[0] ?? '';
  if (!contentLengths.every((value) => DIGITS.test(value)))
    throw new Http1ResponseError(`sent an invalid Content-Length (${quote(contentLengths.join(', '))})`);
  if (contentLengths.some((value) => value !== first))
    throw new Http1ResponseError(`sent differing Content-Length values (${quote(contentLengths.join(', '))})`);
  const length = Number(first);
  if (!Number.isSafeInteger(length)) throw new Http1ResponseError(`sent a Content-Length too large to read (${quote(first)})`);
  return { kind: 'length', length };
}
