// The snapshotter's side of the FUSE server: a LayerMounter whose mounts live in the server
// process. It starts the server when none answers on the root's socket, and again after the
// server died (the snapshotter then finds the old mounts dead and mounts them again).
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import type { Logger } from '../../common/log.js';
import type { BlobRef } from '../layers-ahead.js';
import type { RemoteSource } from '../metadata.js';
import type { LayerMounter, MountedLayer, RemoteLayerSettings } from '../remote-layers.js';
import { fuseServerPaths, readMessages, writeMessage, type FuseServerAnswer, type FuseServerRequest } from './protocol.js';

/** Requests that carry no id yet (it is given when sent). */
type Call = FuseServerRequest extends infer R ? (R extends { id: number } ? Omit<R, 'id'> : never) : never;

const START_TIMEOUT_MS = 15_000;

export interface FuseServerClientOptions {
  root: string;
  settings: RemoteLayerSettings;
  /** Passed to a server this client starts. */
  logLevel: string;
  idleExitSeconds: number;
  log: Logger;
}

export class FuseServerClient implements LayerMounter {
  private connection?: Promise<net.Socket>;
  private readonly pending = new Map<number, { resolve(value: unknown): void; reject(error: Error): void }>();
  private nextId = 1;
  private closed = false;

  constructor(private readonly options: FuseServerClientOptions) {}

  ensure(id: string, mountpoint: string, cacheDir: string, source: RemoteSource): Promise<void> {
    return this.call({ op: 'ensure', layer: id, mountpoint, cacheDir, source }) as Promise<void>;
  }

  resolveAhead(blobs: BlobRef[]): Promise<void> {
    return this.call({ op: 'resolveAhead', blobs }) as Promise<void>;
  }

  release(id: string, mountpoint: string): Promise<void> {
    return this.call({ op: 'release', layer: id, mountpoint }) as Promise<void>;
  }

  layers(): Promise<MountedLayer[]> {
    return this.call({ op: 'layers' }) as Promise<MountedLayer[]>;
  }

  /** Disconnects; the server goes on serving the mounts. */
  async close(): Promise<void> {
    this.closed = true;
    const socket = await this.connection?.catch(() => undefined);
    socket?.end();
  }

  /** Asks the server to unmount everything and exit. */
  async shutdownServer(): Promise<void> {
    await this.call({ op: 'shutdown' });
  }

  private async call(request: Call): Promise<unknown> {
    if (this.closed) throw new Error('the FUSE server client is closed');
    const socket = await this.connect();
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      writeMessage(socket, { ...request, id });
    });
  }

  private connect(): Promise<net.Socket> {
    this.connection ??= this.open().catch((error: Error) => {
      this.connection = undefined;
      throw error;
    });
    return this.connection;
  }

  /** Connects to the root's server, starting one when none answers; then says hello. */
  private async open(): Promise<net.Socket> {
    const { socket: path, logFile } = fuseServerPaths(this.options.root);
    let socket = await dial(path);
    if (!socket) {
      this.start(logFile);
      const deadline = Date.now() + START_TIMEOUT_MS;
      while (!socket && Date.now() < deadline) {
        await sleep(50);
        socket = await dial(path);
      }
      if (!socket) throw new Error(`the FUSE server did not start within ${START_TIMEOUT_MS} ms (see ${logFile})`);
    }
    const connected = socket;
    readMessages(connected, (message) => {
      const answer = message as FuseServerAnswer;
      const waiter = this.pending.get(answer.id);
      if (!waiter) return;
      this.pending.delete(answer.id);
      if (answer.ok) waiter.resolve(answer.result);
      else waiter.reject(new Error(answer.error));
    });
    connected.on('error', (error) => this.options.log.warn({ err: error.message }, 'FUSE server connection error'));
    connected.on('close', () => {
      if (this.connection) this.connection = undefined;
      for (const waiter of this.pending.values()) waiter.reject(new Error('lost the connection to the FUSE server'));
      this.pending.clear();
      if (!this.closed) this.options.log.warn('lost the FUSE server; the next request starts or finds one');
    });
    const id = this.nextId++;
    const hello = new Promise((resolve, reject) => this.pending.set(id, { resolve, reject }));
    writeMessage(connected, { id, op: 'hello', settings: this.options.settings });
    const { pid } = (await hello) as { pid: number };
    this.options.log.info({ pid, socket: path }, 'connected to the FUSE server');
    return connected;
  }

  /** Starts `starling fuse-server` detached, in its own session: it must outlive this process. */
  private start(logFile: string): void {
    const { entry, execArgv } = cliEntry();
    const log = fs.openSync(logFile, 'a');
    try {
      const child = spawn(
        process.execPath,
        [
          ...execArgv,
          entry,
          'fuse-server',
          '--root',
          this.options.root,
          '--log-level',
          this.options.logLevel,
          '--idle-exit',
          String(this.options.idleExitSeconds),
        ],
        { detached: true, stdio: ['ignore', log, log] },
      );
      child.unref();
      this.options.log.info({ pid: child.pid, logFile }, 'started a FUSE server');
    } finally {
      fs.closeSync(log);
    }
  }
}

/** This installation's CLI: dist/cli/main.js, or src/cli/main.ts when running from sources under tsx. */
function cliEntry(): { entry: string; execArgv: string[] } {
  const fromSources = import.meta.url.endsWith('.ts');
  const entry = fileURLToPath(new URL(`../../cli/main.${fromSources ? 'ts' : 'js'}`, import.meta.url));
  return { entry, execArgv: fromSources ? ['--import', 'tsx'] : [] };
}

function dial(path: string): Promise<net.Socket | undefined> {
  return new Promise((resolve) => {
    const socket = net.connect(path);
    socket.once('connect', () => {
      socket.removeAllListeners('error');
      resolve(socket);
    });
    socket.once('error', () => resolve(undefined));
  });
}
