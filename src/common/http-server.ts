import { createServer, type RequestListener, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { formatHostPort, parseListenAddress } from './net.js';

/** Starts an HTTP server on HOST:PORT and resolves with the address it really got. */
export async function listenHttp(listen: string, handler: RequestListener, what: string): Promise<{ server: Server; address: string }> {
  const { host, port } = parseListenAddress(listen, `${what} listen address`);
  const server = createServer(handler);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const bound = server.address() as AddressInfo;
  return { server, address: formatHostPort({ host: bound.address, port: bound.port }) };
}

export function closeHttp(server: Server): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    server.closeAllConnections();
  });
}
