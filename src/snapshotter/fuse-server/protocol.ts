// The snapshotter's link to its FUSE server: one JSON object per line over a unix socket in the
// snapshotter's root. Requests carry an id; answers name it, so slow mounts do not hold up others.
import path from 'node:path';
import type { Socket } from 'node:net';
import type { BlobRef } from '../layers-ahead.js';
import type { RemoteSource } from '../metadata.js';
import type { RemoteLayerSettings } from '../remote-layers.js';

export type FuseServerRequest =
  | { id: number; op: 'hello'; settings: RemoteLayerSettings }
  | { id: number; op: 'ensure'; layer: string; mountpoint: string; cacheDir: string; source: RemoteSource }
  | { id: number; op: 'resolveAhead'; blobs: BlobRef[] }
  | { id: number; op: 'release'; layer: string; mountpoint: string }
  | { id: number; op: 'layers' }
  | { id: number; op: 'shutdown' };

export type FuseServerAnswer = { id: number; ok: true; result?: unknown } | { id: number; ok: false; error: string };

/** Where the FUSE server of a snapshotter root keeps its socket, pid and log. */
export function fuseServerPaths(root: string): { socket: string; pidFile: string; logFile: string } {
  return {
    socket: path.join(root, 'fuse-server.sock'),
    pidFile: path.join(root, 'fuse-server.pid'),
    logFile: path.join(root, 'fuse-server.log'),
  };
}

/** Calls `onMessage` with each JSON line the socket receives; a line that is not JSON ends the connection. */
export function readMessages(socket: Socket, onMessage: (message: unknown) => void): void {
  let buffered = '';
  socket.setEncoding('utf8');
  socket.on('data', (text: string) => {
    buffered += text;
    for (let newline = buffered.indexOf('\n'); newline >= 0; newline = buffered.indexOf('\n')) {
      const line = buffered.slice(0, newline);
      buffered = buffered.slice(newline + 1);
      if (!line.trim()) continue;
      let message: unknown;
      try {
        message = JSON.parse(line);
      } catch {
        socket.destroy(new Error(`not JSON: ${line.slice(0, 80)}`));
        return;
      }
      onMessage(message);
    }
  });
}

export function writeMessage(socket: Socket, message: FuseServerRequest | FuseServerAnswer): void {
  if (!socket.destroyed) socket.write(`${JSON.stringify(message)}\n`);
}
