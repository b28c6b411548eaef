import { pino, type Logger } from 'pino';

export type { Logger };

export interface LogOptions {
  level?: string;
  /** Force pretty (true) or JSON (false) output; by default pretty only on a TTY. */
  pretty?: boolean;
  name?: string;
}

/** Structured JSON logs on stderr; human-readable when a person is watching. */
export function createLogger(options: LogOptions = {}): Logger {
  const level = options.level ?? process.env.STARLING_LOG_LEVEL ?? 'info';
  const pretty = options.pretty ?? Boolean(process.stderr.isTTY);
  if (pretty) {
    return pino({
      level,
      name: options.name,
      transport: { target: 'pino-pretty', options: { destination: 2, colorize: true } },
    });
  }
  return pino({ level, name: options.name }, pino.destination(2));
}

/** A logger that drops everything; for library use and unit tests. */
export const silentLogger: Logger = pino({ level: 'silent' });
