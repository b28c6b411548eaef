import type { Server } from 'node:net';
import type { Logger } from './log.js';

/** Refused connections are logged at most this often. */
const DROP_LOG_INTERVAL_MS = 60_000;

/**
 * Caps the connections a listening server holds at once: Node refuses more at accept, before a
 * byte is read (21,000 idle connections once took a peer's last file descriptors, and it stopped
 * answering without a word). The refusals are logged, at most once a minute, with their count.
 */
export function capConnections(server: Server, maxConnections: number, what: string, log: Logger | undefined): void {
  server.maxConnections = maxConnections;
  let lastLog = 0;
  let refused = 0;
  server.on('drop', () => {
    refused++;
    const now = Date.now();
    if (now - lastLog < DROP_LOG_INTERVAL_MS) return;
    lastLog = now;
    log?.warn({ server: what, maxConnections, refused }, 'connection limit reached: refusing new connections');
    refused = 0;
  });
}
