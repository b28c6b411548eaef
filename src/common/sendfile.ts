// Sending file bytes to an HTTP response's socket with sendfile(2) (native/sendfile): the bytes
// go from the page cache to the socket without being copied through JavaScript, which is what
// lets a cache hit keep up with a static file server. Anything unusual (TLS, no addon, no file
// descriptor on the socket) makes it decline, and the caller copies the bytes as before.
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { optionalAddon } from './native-addon.js';

interface SendfileAddon {
  sendFile(socketFd: number, fileFd: number, offset: number, count: number, timeoutMs: number): Promise<number>;
}

/** A client that takes nothing for this long is given up on (as a stalled write would be). */
const STALL_TIMEOUT_MS = 120_000;
/** Below this, a copy costs less than waking a thread. */
const MIN_SENDFILE_BYTES = 256 * 1024;

/** Without the addon, every caller copies. */
const loadAddon = () => optionalAddon<SendfileAddon>('sendfile', 'starling_sendfile');

/**
 * Sends bytes [offset, offset + count) of the open file `fileFd` as (part of) the body of `res`,
 * whose headers have been set. Resolves false, having sent nothing, when it cannot be done here;
 * rejects if the transfer fails part-way (the response is then unusable, as after a failed write).
 */
export async function sendFileRange(res: ServerResponse, fileFd: number, offset: number, count: number): Promise<boolean> {
  const native = count >= MIN_SENDFILE_BYTES ? loadAddon() : null;
  const socket: (Socket & { encrypted?: boolean; _handle?: { fd?: number } }) | null = res.socket;
  const socketFd = socket?._handle?.fd;
  if (!native || !socket || socket.encrypted || typeof socketFd !== 'number' || socketFd < 0) return false;
  // The headers (and anything written before) must be on the wire before the file bytes: the
  // response may still be waiting for its socket (keep-alive), or hold them in its own buffer or
  // a corked socket, none of which 'drain' reports. Wait until every layer is empty.
  // (headersSent turns true at writeHead, before anything is written: flush unconditionally.)
  res.flushHeaders();
  const deadline = Date.now() + STALL_TIMEOUT_MS;
  while (
    res.writableLength > 0 ||
    socket.writableLength > 0 ||
    socket.writableCorked > 0 ||
    (socket as { _httpMessage?: unknown })._httpMessage !== res
  ) {
    if (res.destroyed || socket.destroyed) throw new Error('the client went away');
    if (Date.now() > deadline) throw new Error('the response headers never left');
    await sleep(1);
  }
  await native.sendFile(socketFd, fileFd, offset, count, STALL_TIMEOUT_MS);
  return true;
}
