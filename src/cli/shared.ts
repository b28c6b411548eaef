import path from 'node:path';
import type { Logger } from '../common/log.js';

/**
 * How this program was run, for commands printed to be pasted: `starling` when installed as that
 * command, else `node <script>` (as the README starts it, from a checkout).
 */
export function invokedAs(): string {
  const script = process.argv[1];
  if (!script || path.basename(script) === 'starling') return 'starling';
  const relative = path.relative(process.cwd(), script);
  return `node ${relative.startsWith('..') ? script : relative}`;
}

/** Commander option reducer for repeatable flags. */
export function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}

/** Keeps a daemon running until SIGINT or SIGTERM, then closes it once. */
export function waitForShutdown(log: Logger, close: () => Promise<void>): Promise<void> {
  return new Promise((resolve) => {
    let closing = false;
    const stop = (signal: string) => {
      if (closing) return;
      closing = true;
      log.info({ signal }, 'shutting down');
      close()
        .catch((error) => log.error({ err: (error as Error).message }, 'error while shutting down'))
        .finally(() => resolve());
    };
    process.once('SIGINT', () => stop('SIGINT'));
    process.once('SIGTERM', () => stop('SIGTERM'));
  });
}
