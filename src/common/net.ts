import { isIPv4 } from 'node:net';

export interface ListenAddress {
  host: string;
  port: number;
}

/** Parses "HOST:PORT", "[::1]:PORT" or ":PORT" (all interfaces). */
export function parseListenAddress(value: string, what = 'listen address'): ListenAddress {
  const match = /^(?:\[([0-9a-fA-F:.]+)\]|([^:[\]]*)):(\d{1,5})$/.exec(value.trim());
  const port = match ? Number(match[3]) : NaN;
  if (!match || port > 65535) {
    throw new Error(`invalid ${what} "${value}" (expected HOST:PORT, for example 127.0.0.1:65001)`);
  }
  return { host: match[1] ?? (match[2] || '0.0.0.0'), port };
}

export function formatHostPort(address: ListenAddress): string {
  return address.host.includes(':') ? `[${address.host}]:${address.port}` : `${address.host}:${address.port}`;
}

/**
 * Whether a connection comes from this host: from a loopback address, or from the very address it
 * reached (a process calling its own host's IP).
 */
export function isFromThisHost(socket: { remoteAddress?: string; localAddress?: string }): boolean {
  return isLoopbackAddress(socket.remoteAddress) || (socket.remoteAddress !== undefined && socket.remoteAddress === socket.localAddress);
}

/** Whether a peer address (as a socket reports it) is this host's loopback: 127.0.0.0/8, ::1, or either mapped. */
export function isLoopbackAddress(address: string | undefined): boolean {
  if (!address) return false;
  const plain = address.startsWith('::ffff:') && isIPv4(address.slice(7)) ? address.slice(7) : address;
  return plain === '::1' || (isIPv4(plain) && plain.startsWith('127.'));
}
