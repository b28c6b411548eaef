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
