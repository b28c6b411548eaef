import { z } from 'zod';
import { rateField, sizeField } from '../common/config.js';
import { DEFAULT_LIMITS } from '../common/http-server.js';
import { parseListenAddress } from '../common/net.js';
import { tlsFilesSchema } from '../common/tls.js';
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

/** An http(s) URL with no path: a registry's or the manager's base URL. */
const baseUrl = (example: string) =>
  z.string().refine(
    (value) => {
      try {
        const url = new URL(value);
        return (url.protocol === 'http:' || url.protocol === 'https:') && url.pathname === '/' && !url.search;
      } catch {
        return false;
      }
    },
    { message: `expected a base URL such as ${example}` },
  );

const UPLOAD_MAX_CONNECTIONS = 8192;

/** The peer's configuration file (YAML) and flags, in one validated shape. Unknown keys are errors. */
export const peerConfigSchema = z
  .object({
    dataDir: z.string().min(1, 'must not be empty'),
    mirror: z
      .object({
        listen: listenAddress.default('127.0.0.1:65001'),
        /** Connections open at once (each holds a file descriptor); more are refused at accept, and the refusal is logged. */
        maxConnections: z.number().int().min(1).default(DEFAULT_LIMITS.maxConnections),
      })
      .strict()
      .default({ listen: '127.0.0.1:65001', maxConnections: DEFAULT_LIMITS.maxConnections }),
    registries: z
      .object({
        insecure: z.array(z.string().refine(isRegistryHost, { message: 'expected HOST[:PORT]' })).default([]),
        default: baseUrl('https://registry.example.com or http://127.0.0.1:5000').optional(),
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
    swarm: z
      .object({
        /** Scheduler addresses; none (and no manager) means the peer works alone as a pull-through cache. */
        schedulers: z.array(listenAddress).default([]),
        /** The manager's URL: it tells the peer its schedulers and sends it preheat jobs. */
        manager: baseUrl('http://10.0.0.1:8080').optional(),
        uploadListen: listenAddress.default('127.0.0.1:65002'),
        /**
         * Connections the upload server holds at once (children keep one per parent and task, a
         * long poll and pieces); more are refused at accept, and the refusal is logged.
         */
        uploadMaxConnections: z.number().int().min(1).default(UPLOAD_MAX_CONNECTIONS),
        /** The address other peers use to reach the upload server; defaults to its listen host. */
        advertiseIp: z.string().optional(),
        hostId: z.string().min(1).optional(),
        seed: z.boolean().default(false),
        labels: z.record(z.string(), z.string()).default({}),
        /** A YAML or JSON map of Kubernetes node labels; topology.kubernetes.io/zone becomes `zone`, and so on. */
        labelsFile: z.string().optional(),
        clusterTokenFile: z.string().optional(),
        uploadSlots: z.number().int().min(1).max(1024).optional(),
        uploadRateLimit: rateField().default(0),
        pieceParallelism: z.number().int().min(1).max(256).default(8),
        perParent: z.number().int().min(1).max(64).default(3),
        pieceTimeoutMs: z.number().int().min(100).default(15_000),
        stallMs: z.number().int().min(100).default(10_000),
      })
      .strict()
      .default({
        schedulers: [],
        uploadListen: '127.0.0.1:65002',
        uploadMaxConnections: UPLOAD_MAX_CONNECTIONS,
        seed: false,
        labels: {},
        uploadRateLimit: 0,
        pieceParallelism: 8,
        perParent: 3,
        pieceTimeoutMs: 15_000,
        stallMs: 10_000,
      }),
    /**
     * TLS between the cluster's components: the upload server serves HTTPS with `cert`, and the
     * peer reaches other peers, schedulers and the manager over TLS checked against `ca`. The
     * mirror (loopback, for containerd) stays plain HTTP.
     */
    tls: tlsFilesSchema.optional(),
    log: z
      .object({
        level: z.enum(['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent']).default('info'),
      })
      .strict()
      .default({ level: 'info' }),
  })
  .strict();

export type PeerConfig = z.output<typeof peerConfigSchema>;
