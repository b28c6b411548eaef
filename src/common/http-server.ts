import { createServer as createHttpServer, type IncomingMessage, type RequestListener, type Server } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo, Socket } from 'node:net';
import { capConnections } from './connection-cap.js';
import type { Logger } from './log.js';
import { formatHostPort, parseListenAddress } from './net.js';
import { serverTlsOptions, type ClusterTls } from './tls.js';

/**
 * What one HTTP server lets its clients hold. Every listening port assumes a hostile client on the
 * same network: a connection that never sends a request, one that sends its headers a byte at a
 * time, thousands left open. The first two are closed after `headersTimeout` (Node's own check,
 * made every second here rather than every 30 s, covers the second); the cap bounds the third
 * (21,000 idle connections once took a peer's last file descriptors, and it stopped answering
 * without a word).
 */
export interface ServerLimits {
  /** Connections open at once; more are refused at accept, and the refusal is logged. */
  maxConnections: number;
  /** Time allowed for a request's headers to arrive, from the connection's first byte or its last response. */
  headersTimeoutMs: number;
  /** Time allowed for a whole request, body included, to arrive (answers may take as long as they take). */
  requestTimeoutMs: number;
  /** A kept-alive connection with no request for this long is closed. */
  keepAliveTimeoutMs: number;
  /** A connection with no bytes either way for this long is closed (a client that stopped reading, a half-open one). */
  idleTimeoutMs: number;
}

export const DEFAULT_LIMITS: ServerLimits = {
  maxConnections: 4096,
  headersTimeoutMs: 20_000,
  requestTimeoutMs: 60_000,
  keepAliveTimeoutMs: 30_000,
  idleTimeoutMs: 120_000,
};

/** How often Node looks for connections past their headers or request timeout. */
const CHECK_INTERVAL_MS = 1_000;
export interface ServerOptions {
  limits?: Partial<ServerLimits>;
  /** Serve HTTPS with the cluster's certificate. */
  tls?: ClusterTls;
  /** Where refused connections are reported. */
  log?: Logger;
  /** What the server is, in log lines and errors ("upload", "peer mirror"). */
  what: string;
}

/** An HTTP (or HTTPS) server with the limits every Starling port keeps. */
export function createLimitedServer(handler: RequestListener, options: ServerOptions): Server {
  const limits = { ...DEFAULT_LIMITS, ...options.limits };
  const common = {
    headersTimeout: limits.headersTimeoutMs,
    requestTimeout: limits.requestTimeoutMs,
    keepAliveTimeout: limits.keepAliveTimeoutMs,
    connectionsCheckingInterval: CHECK_INTERVAL_MS,
  };
  const server: Server = options.tls
    ? createHttpsServer({ ...common, ...serverTlsOptions(options.tls), handshakeTimeout: limits.headersTimeoutMs }, handler)
    : createHttpServer(common, handler);
  capConnections(server, limits.maxConnections, options.what, options.log);
  server.setTimeout(limits.idleTimeoutMs, (socket) => socket.destroy());
  // Node's header timeout starts with a connection's first byte: one that sends none is closed
  // here (measured: silent connections stayed open past every Node timeout but the idle one).
  const asked = new WeakSet<object>();
  server.on('request', (req: IncomingMessage) => asked.add(req.socket));
  server.on(options.tls ? 'secureConnection' : 'connection', (socket: Socket) => {
    const timer = setTimeout(() => {
      if (!asked.has(socket)) socket.destroy();
    }, limits.headersTimeoutMs);
    timer.unref();
    socket.once('close', () => clearTimeout(timer));
  });
  // A TLS handshake that fails (a client without the cluster CA, a plain-HTTP client) is the client's problem.
  server.on('tlsClientError', (error: Error) => options.log?.debug({ server: options.what, err: error.message }, 'TLS handshake refused'));
  return server;
}

/** Starts a limited server on HOST:PORT and resolves with the address it really got. */
export async function listenHttp(
  listen: string,
  handler: RequestListener,
  options: ServerOptions,
): Promise<{ server: Server; address: string }> {
  const { host, port } = parseListenAddress(listen, `${options.what} listen address`);
  const server = createLimitedServer(handler, options);
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
