// A stand-in for a peer's upload server, as far as preheat goes: `POST /_starling/preheat`
// and `GET /_starling/preheat/<digest>` with the cluster token, behaving as told. The real
// peer side is tested with real peers elsewhere; this one lets the job engine meet every outcome.

import http from 'node:http';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import type { TLSSocket } from 'node:tls';
import { blobFetchRequestSchema, PREHEAT_PATH, PREHEAT_STATUS_PATH, type BlobFetchRequest } from '../../src/rpc/upload-api.js';
import { parseWire } from '../../src/rpc/wire.js';
import { serverTlsOptions, type ClusterTls } from '../../src/common/tls.js';

export type Behaviour =
  /** Accepts, then reports growing storedBytes until complete (in `steps` polls). */
  | 'complete'
  /** Answers the trigger with 400 and a reason. */
  | 'refuse'
  /** Accepts, then its fetch fails: status carries `error`. */
  | 'fail'
  /** Accepts, stores half, never completes. */
  | 'stall'
  /** Accepts, then forgets once (status 404, as after a restart), then completes. */
  | 'forget-once';

export interface Trigger {
  authorization?: string;
  /** Whether the request came over TLS. */
  encrypted: boolean;
  body: BlobFetchRequest;
}

/** One request from a manager: which replica sent it (from its User-Agent) and when it began and ended. */
export interface StubRequest {
  kind: 'trigger' | 'status';
  replica: string;
  startedAt: number;
  endedAt?: number;
}

export interface StubPeer {
  port: number;
  hostId: string;
  triggers: Trigger[];
  statusPolls: number;
  requests: StubRequest[];
  /** Drops every fetch, as a restarted peer does: the next status request answers 404. */
  forget(): void;
  /** A stalled peer's fetches go on from here, and complete. */
  unstall(): void;
  close(): Promise<void>;
}

export interface StubOptions {
  /** Polls a 'complete' fetch takes to finish. */
  steps?: number;
  /** Each answer waits this long, so that requests are in flight a good part of the time. */
  delayMs?: number;
  /** Serve HTTPS with the cluster's certificate, as a peer started with --tls-* does. */
  tls?: ClusterTls;
}

export async function startStubPeer(
  hostId: string,
  behaviour: Behaviour,
  clusterToken: string,
  options: StubOptions = {},
): Promise<StubPeer> {
  const { steps = 3, delayMs = 0 } = options;
  const tasks = new Map<string, { size: number; stored: number }>();
  let forgotten = false;
  let current = behaviour;
  const stub: StubPeer = {
    port: 0,
    hostId,
    triggers: [],
    statusPolls: 0,
    requests: [],
    forget: () => tasks.clear(),
    unstall: () => {
      if (current === 'stall') current = 'complete';
    },
    close: async () => {},
  };
  const reply = (res: http.ServerResponse, status: number, body: unknown) => {
    setTimeout(() => {
      if (res.destroyed) return;
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    }, delayMs);
  };
  const handler: http.RequestListener = (req, res) => {
    const seen: StubRequest = {
      kind: req.method === 'POST' ? 'trigger' : 'status',
      replica: /replica ([^)]+)/.exec(req.headers['user-agent'] ?? '')?.[1] ?? 'unknown',
      startedAt: performance.now(),
    };
    stub.requests.push(seen);
    // Ends when the answer is sent or the manager gives the request up, whichever comes first.
    res.on('close', () => (seen.endedAt = performance.now()));
    let text = '';
    req.on('data', (chunk: Buffer) => (text += chunk.toString()));
    req.on('end', () => {
      if (req.headers.authorization !== `Bearer ${clusterToken}`) return reply(res, 401, { error: 'missing or wrong cluster token' });
      if (req.method === 'POST' && req.url === PREHEAT_PATH) {
        // As the real peer does: a body off the contract is refused, naming what is wrong.
        let body: BlobFetchRequest;
        try {
          body = parseWire(blobFetchRequestSchema, JSON.parse(text), 'preheat request');
        } catch (error) {
          return reply(res, 400, { error: (error as Error).message });
        }
        stub.triggers.push({ authorization: req.headers.authorization, encrypted: (req.socket as TLSSocket).encrypted === true, body });
        if (current === 'refuse') return reply(res, 400, { error: 'disk quota would be exceeded' });
        tasks.set(body.taskId, { size: body.contentLength, stored: 0 });
        return reply(res, 202, { accepted: true });
      }
      const [, digest] = PREHEAT_STATUS_PATH.exec(req.url ?? '') ?? [];
      if (req.method === 'GET' && digest !== undefined) {
        stub.statusPolls++;
        const task = tasks.get(digest);
        if (current === 'forget-once' && !forgotten && task) {
          forgotten = true;
          tasks.delete(digest);
        }
        if (!task || !tasks.has(digest)) return reply(res, 404, { error: `no preheat of ${digest} here` });
        if (current === 'fail')
          return reply(res, 200, { digest, size: task.size, storedBytes: 0, complete: false, error: 'origin answered HTTP 500' });
        if (current === 'stall') {
          task.stored = Math.floor(task.size / 2);
          return reply(res, 200, { digest, size: task.size, storedBytes: task.stored, complete: false });
        }
        task.stored = Math.min(task.size, task.stored + Math.ceil(task.size / steps));
        return reply(res, 200, { digest, size: task.size, storedBytes: task.stored, complete: task.stored === task.size });
      }
      reply(res, 404, { error: 'no such endpoint' });
    });
  };
  const server = options.tls ? https.createServer(serverTlsOptions(options.tls), handler) : http.createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  stub.port = (server.address() as AddressInfo).port;
  stub.close = () =>
    new Promise((resolve) => {
      server.close(() => resolve());
      server.closeAllConnections();
    });
  return stub;
}
