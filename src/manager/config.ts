import { join } from 'node:path';
import { z } from 'zod';
import { tlsFilesSchema } from '../common/tls.js';

/** The manager process: where it listens, where it keeps its state, and its timings. */
export const managerConfigSchema = z
  .object({
    listen: z.string().default('127.0.0.1:8080'),
    /** Where the default SQLite database lives when `db` is not given. */
    dataDir: z.string().min(1, 'must not be empty').default('.starling/manager'),
    /** `sqlite:PATH` or `postgres://user:pass@host:port/db`; default `sqlite:<dataDir>/manager.db`. */
    db: z
      .string()
      .regex(/^(sqlite:.+|postgres(ql)?:\/\/.+)$/, 'must be sqlite:PATH or postgres://...')
      .optional(),
    /** The token schedulers and peers present (and the manager presents to peers). Required. */
    clusterTokenFile: z.string().optional(),
    /** A file holding the initial admin's token; without it one is generated and printed once at first start. */
    adminTokenFile: z.string().optional(),
    /** Registries reached over plain HTTP; loopback registries always are (as Docker does). */
    registries: z
      .object({ insecure: z.array(z.string()).default([]) })
      .strict()
      .default({ insecure: [] }),
    keepalive: z
      .object({
        /** Schedulers and peers call every this often... */
        intervalMs: z.number().int().min(50).default(5_000),
        /** ...and are inactive after missing this many calls. */
        missedLimit: z.number().int().min(1).default(3),
      })
      .strict()
      .default({ intervalMs: 5_000, missedLimit: 3 }),
    preheat: z
      .object({
        /** How often each target peer is asked how its fetch is going. */
        pollMs: z.number().int().min(10).default(1_000),
        /** A job still unfinished after this long fails. */
        timeoutMs: z
          .number()
          .int()
          .min(100)
          .default(60 * 60_000),
        /** Peer requests in flight at once per job. */
        concurrency: z.number().int().min(1).max(256).default(16),
        /**
         * A job is held by the replica running it for this long without a renewal (renewed every
         * third of it): a replica that dies has its jobs taken over by another this long after.
         */
        leaseMs: z.number().int().min(500).default(15_000),
      })
      .strict()
      .default({ pollMs: 1_000, timeoutMs: 60 * 60_000, concurrency: 16, leaseMs: 15_000 }),
    /** HTTPS on the API and console, and TLS towards the peers' upload ports (checked against `ca`). */
    tls: tlsFilesSchema.optional(),
    /** The web console's built files; served at / when the folder exists. */
    consoleDir: z.string().optional(),
    log: z
      .object({ level: z.enum(['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent']).default('info') })
      .strict()
      .default({ level: 'info' }),
  })
  .strict();

export type ManagerConfig = z.output<typeof managerConfigSchema>;

export function databaseUrl(config: ManagerConfig): string {
  return config.db ?? `sqlite:${join(config.dataDir, 'manager.db')}`;
}
