// The scheduler's gRPC port, with the limits every Starling port keeps (docs/security.md, "Limits").
// grpc-js 1.14 closes idle connections, pings its clients and bounds streams per connection
// itself, but has no connection cap and listens only through its own servers: the port is a
// net.Server of ours, capped as the HTTP servers are, whose connections go to grpc-js through its
// connection injector (Server.createConnectionInjector).
//
// grpc-js closes an idle connection gracefully: a GOAWAY, then Node ends its side and waits for
// the client's. A client that never reads again never closes, and its connection (a slot under
// the cap, a file descriptor) stayed in FIN-WAIT-2 for good. So the listener also closes any
// connection with no byte either way for as long as a live client takes to answer a ping.
import * as grpc from '@grpc/grpc-js';
import net, { type AddressInfo, type Socket } from 'node:net';
import { z } from 'zod';
import { capConnections } from '../common/connection-cap.js';
import type { Logger } from '../common/log.js';
import { formatHostPort, parseListenAddress } from '../common/net.js';

/** The largest message a gRPC client may send (a register lists at most 262,144 held pieces). */
export const MAX_GRPC_MESSAGE_BYTES = 16 * 1024 * 1024;

export const grpcLimitsSchema = z
  .object({
    /** Connections open at once; more are refused at accept, and the refusal is logged. */
    maxConnections: z.number().int().min(1).default(8192),
    /**
     * Streams open at once on one connection. A peer keeps one stream per blob it holds (it stays
     * a parent), on the scheduler that owns the blob: this must exceed the most blobs a peer (a
     * seed) holds, or its further streams wait for one to close.
     */
    maxStreamsPerConnection: z.number().int().min(1).default(16_384),
    /** A connection with no call open for this long is closed (live peers announce their host every few seconds). */
    idleConnectionMs: z.number().int().min(100).default(120_000),
    /** The scheduler pings each client this often... */
    keepaliveMs: z.number().int().min(100).default(60_000),
    /** ...and closes the connection when the answer takes longer than this (a client gone without a word). */
    keepaliveTimeoutMs: z.number().int().min(100).default(20_000),
  })
  .strict();

export type GrpcLimits = z.output<typeof grpcLimitsSchema>;

export const DEFAULT_GRPC_LIMITS: GrpcLimits = grpcLimitsSchema.parse({});

/** A gRPC server that holds its clients to `limits` (the connection cap is the listener's: listenGrpc). */
export function limitedGrpcServer(limits: GrpcLimits): grpc.Server {
  return new grpc.Server({
    'grpc.max_receive_message_length': MAX_GRPC_MESSAGE_BYTES,
    'grpc.max_concurrent_streams': limits.maxStreamsPerConnection,
    'grpc.max_connection_idle_ms': limits.idleConnectionMs,
    'grpc.keepalive_time_ms': limits.keepaliveMs,
    'grpc.keepalive_timeout_ms': limits.keepaliveTimeoutMs,
  });
}

export interface GrpcListener {
  /** HOST:PORT as listened on (the port the system chose when 0 was asked). */
  address: string;
  port: number;
  /** Stops accepting, lets the calls under way end, then ends every connection (those still in a TLS handshake too). */
  close(): Promise<void>;
}

/** Listens on HOST:PORT with at most `limits.maxConnections` connections, each handed to `server`. */
export async function listenGrpc(
  server: grpc.Server,
  listen: string,
  credentials: grpc.ServerCredentials,
  options: { limits: GrpcLimits; what: string; log?: Logger },
): Promise<GrpcListener> {
  const { host, port } = parseListenAddress(listen, `${options.what} listen address`);
  const injector = server.createConnectionInjector(credentials);
  // A live client's connection carries the scheduler's ping and its answer this often at least.
  const silentLimitMs = options.limits.keepaliveMs + options.limits.keepaliveTimeoutMs;
  const lastTraffic = new Map<Socket, { bytes: number; at: number }>();
  const tcp = net.createServer({ noDelay: true }, (socket) => {
    lastTraffic.set(socket, { bytes: 0, at: Date.now() });
    socket.once('close', () => lastTraffic.delete(socket));
    // A client that resets its connection is its own problem; grpc-js ends the session.
    socket.on('error', () => undefined);
    injector.injectConnection(socket);
  });
  capConnections(tcp, options.limits.maxConnections, options.what, options.log);
  await new Promise<void>((resolve, reject) => {
    tcp.once('error', reject);
    tcp.listen(port, host, () => {
      tcp.off('error', reject);
      resolve();
    });
  });
  const sweep = setInterval(
    () => {
      const now = Date.now();
      for (const [socket, seen] of lastTraffic) {
        // The TCP handle's counts: TLS reads and writes through it too.
        const bytes = socket.bytesRead + socket.bytesWritten;
        if (bytes !== seen.bytes) lastTraffic.set(socket, { bytes, at: now });
        else if (now - seen.at >= silentLimitMs) socket.destroy();
      }
    },
    Math.min(5_000, silentLimitMs / 4),
  );
  sweep.unref();
  const bound = (tcp.address() as AddressInfo).port;
  return {
    address: formatHostPort({ host, port: bound }),
    port: bound,
    close: async () => {
      const closed = new Promise<void>((resolve) => tcp.close(() => resolve()));
      await new Promise<void>((resolve) => server.tryShutdown(() => resolve()));
      server.forceShutdown();
      clearInterval(sweep);
      for (const socket of lastTraffic.keys()) socket.destroy();
      await closed;
    },
  };
}
