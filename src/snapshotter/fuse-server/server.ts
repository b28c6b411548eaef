// `starling fuse-server`: the process that serves a snapshotter's lazy FUSE mounts. The
// snapshotter starts it detached and talks to it over a unix socket; because the FUSE sessions
// live here, a snapshotter restart (even kill -9) leaves every mount, and the containers whose
// overlays stack them, working. It stops on SIGTERM or a shutdown request (unmounting what it
// serves), or by itself once it has served nothing and had no client for `idleExitMs`.
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import net from 'node:net';
import type { Logger } from '../../common/log.js';
import { RemoteLayers } from '../remote-layers.js';
import { fuseServerPaths, readMessages, writeMessage, type FuseServerAnswer, type FuseServerRequest } from './protocol.js';

export interface FuseServerOptions {
  root: string;
  idleExitMs: number;
  log: Logger;
}

export interface RunningFuseServer {
  socket: string;
  /** Resolves when the server has stopped (shutdown request, close(), or idle). */
  stopped: Promise<void>;
  close(): Promise<void>;
}

export async function startFuseServer(options: FuseServerOptions): Promise<RunningFuseServer> {
  const { log } = options;
  const paths = fuseServerPaths(options.root);
  await fsp.mkdir(options.root, { recursive: true, mode: 0o700 });
  if (await answers(paths.socket)) throw new Error(`a FUSE server already serves ${options.root} (socket ${paths.socket})`);
  await fsp.rm(paths.socket, { force: true });

  let layers: RemoteLayers | undefined;
  const clients = new Set<net.Socket>();
  let lastActive = Date.now();
  let stopping: Promise<void> | undefined;
  let resolveStopped!: () => void;
  const stopped = new Promise<void>((resolve) => (resolveStopped = resolve));

  const handle = async (request: FuseServerRequest): Promise<unknown> => {
    if (request.op === 'hello') {
      if (layers) layers.configure(request.settings);
      else layers = new RemoteLayers(request.settings, log);
      return { pid: process.pid };
    }
    if (request.op === 'shutdown') {
      setImmediate(() => void close());
      return undefined;
    }
    if (!layers) throw new Error('no hello yet: the settings are unknown');
    switch (request.op) {
      case 'ensure':
        return layers.ensure(request.layer, request.mountpoint, request.cacheDir, request.source);
      case 'resolveAhead':
        return layers.resolveAhead(request.blobs);
      case 'release':
        return layers.release(request.layer, request.mountpoint);
      case 'layers':
        return layers.layers();
      default:
        throw new Error(`unknown op ${(request as { op: string }).op}`);
    }
  };

  const server = net.createServer((socket) => {
    clients.add(socket);
    lastActive = Date.now();
    socket.on('close', () => {
      clients.delete(socket);
      lastActive = Date.now();
    });
    socket.on('error', (error) => log.debug({ err: error.message }, 'client connection error'));
    readMessages(socket, (message) => {
      const request = message as FuseServerRequest;
      if (typeof request?.id !== 'number' || typeof request.op !== 'string') return void socket.destroy(new Error('malformed request'));
      handle(request).then(
        (result) => writeMessage(socket, { id: request.id, ok: true, result } satisfies FuseServerAnswer),
        (error: Error) => writeMessage(socket, { id: request.id, ok: false, error: error.message } satisfies FuseServerAnswer),
      );
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(paths.socket, () => resolve());
  });
  await fsp.chmod(paths.socket, 0o600);
  await fsp.writeFile(paths.pidFile, `${process.pid}\n`);

  const idleCheck = setInterval(
    () => {
      if (clients.size === 0 && !layers?.busy && Date.now() - lastActive > options.idleExitMs) {
        log.info('nothing served and no snapshotter connected: exiting');
        void close();
      }
    },
    Math.min(5_000, Math.max(100, options.idleExitMs / 2)),
  );
  idleCheck.unref();

  const close = (): Promise<void> => {
    stopping ??= (async () => {
      clearInterval(idleCheck);
      server.close();
      for (const client of clients) client.destroy();
      await layers?.closeAll().catch((error: Error) => log.warn({ err: error.message }, 'unmounting on stop failed'));
      // Only our own files: a newer server may already have taken the socket over.
      if ((await fsp.readFile(paths.pidFile, 'utf8').catch(() => '')).trim() === String(process.pid)) {
        fs.rmSync(paths.pidFile, { force: true });
        fs.rmSync(paths.socket, { force: true });
      }
      log.info('FUSE server stopped');
      resolveStopped();
    })();
    return stopping;
  };

  log.info({ socket: paths.socket, pid: process.pid }, 'FUSE server ready');
  return { socket: paths.socket, stopped, close };
}

/** Whether something accepts connections on the unix socket. */
export function answers(socket: string): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = net.connect(socket);
    probe.once('connect', () => {
      probe.destroy();
      resolve(true);
    });
    probe.once('error', () => resolve(false));
  });
}
