import { z } from 'zod';
import { rateField, sizeField } from '../common/config.js';
import { parseListenAddress } from '../common/net.js';
import { isRegistryHost } from '../oci/registry-hosts.js';

const listenAddress = z.string().refine(
  (value) => {
    try {
      parseListenAddress(value);
      return true;
    } catch {
      return false;
    }
  },
  { message: 'expected HOST:PORT, for example 127.0.0.1:65001' },
);

const registryUrl = z.string().refine(
  (value) => {
    try {
      const url = new URL(value);
      return (url.protocol === 'http:' || url.protocol === 'https:') && url.pathname === '/' && !url.search;
    } catch {
      return false;
    }
  },
  { message: 'expected a registry URL such as https://registry.example.com or http://127.0.0.1:5000' },
);

/** The peer's configuration file (YAML) and flags, in one validated shape. Unknown keys are errors. */
export const peerConfigSchema = z
  .object({
    dataDir: z.string().min(1, 'must not be empty'),
    mirror: z
      .object({
        listen: listenAddress.default('127.0.0.1:65001'),
      })
      .strict()
      .default({ listen: '127.0.0.1:65001' }),
    registries: z
      .object({
        insecure: z
          .array(z.string().refine(isRegistryHost, { message: 'expected HOST[:PORT]' }))
          .default([]),
        default: registryUrl.optional(),
      })
      .strict()
      .default({ insecure: [] }),
    storage: z
      .object({
        quota: sizeField().default(50 * 2 ** 30),
        highWatermark: z.number().gt(0).lte(1).default(0.9),
        lowWatermark: z.number().gt(0).lte(1).default(0.7),
      })
      .strict()
      .refine((s) => s.lowWatermark < s.highWatermark, { message: 'lowWatermark must be below highWatermark', path: ['lowWatermark'] })
      .default({ quota: 50 * 2 ** 30, highWatermark: 0.9, lowWatermark: 0.7 }),
    download: z
      .object({
        rateLimit: rateField().default(0),
      })
      .strict()
      .default({ rateLimit: 0 }),
    log: z
      .object({
        level: z.enum(['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent']).default('info'),
      })
      .strict()
      .default({ level: 'info' }),
  })
  .strict();

export type PeerConfig = z.output<typeof peerConfigSchema>;
