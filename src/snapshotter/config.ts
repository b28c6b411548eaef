import { z } from 'zod';
import { sizeField } from '../common/config.js';
import { parseListenAddress } from '../common/net.js';

const listenAddress = z.string().refine(
  (value) => {
    try {
      parseListenAddress(value);
      return true;
    } catch {
      return false;
    }
  },
  { message: 'expected HOST:PORT, for example 127.0.0.1:65003' },
);

const httpUrl = z.string().refine(
  (value) => {
    try {
      const url = new URL(value);
      return (url.protocol === 'http:' || url.protocol === 'https:') && url.pathname === '/';
    } catch {
      return false;
    }
  },
  { message: "expected the peer mirror's base URL, such as http://127.0.0.1:65001" },
);

/** `starling snapshotter`'s configuration file (YAML) and flags. Unknown keys are errors. */
export const snapshotterConfigSchema = z
  .object({
    /** The gRPC unix socket containerd's proxy_plugins entry points at. */
    socket: z.string().min(1, 'must not be empty'),
    /** Metadata, overlay dirs, FUSE mountpoints and chunk caches. */
    root: z.string().min(1, 'must not be empty'),
    /** The local Starling peer's mirror: every chunk is fetched through it. */
    peer: httpUrl.default('http://127.0.0.1:65001'),
    prefetch: z
      .object({
        /** Fetch the prioritized files ([0, landmark)) before a layer is reported ready. */
        enabled: z.boolean().default(true),
        /** Bytes prefetched from a layer without any landmark (stargz-snapshotter's prefetch_size). */
        size: sizeField().default(0),
        /**
         * Ask the peer for a layer's first byte while its footer and TOC are fetched, so that the
         * peer's fetch of the first piece (where an optimized layer keeps its prioritized files)
         * overlaps them. Costs one piece per layer that turns out to need nothing from there.
         */
        warmFirstPiece: z.boolean().default(true),
        /**
         * When containerd prepares a layer, fetch the footers, TOCs and prefetch ranges of the
         * image's later layers (named by its labels) at once, instead of layer after layer.
         */
        resolveAhead: z.boolean().default(true),
      })
      .strict()
      .default({ enabled: true, size: 0, warmFirstPiece: true, resolveAhead: true }),
    backgroundFetch: z
      .object({
        enabled: z.boolean().default(true),
        /** Background requests at once, for all the layers of the node together. */
        concurrency: z.number().int().min(1).max(64).default(2),
        /** Quiet time (no mount, prefetch or on-demand fetch of any layer) before each background request. */
        idleMs: z.number().int().min(0).default(100),
      })
      .strict()
      .default({ enabled: true, concurrency: 2, idleMs: 100 }),
    fuse: z
      .object({
        /** Seconds the kernel caches attributes and names (layers are immutable). */
        attrTimeout: z.number().min(0).default(60),
        entryTimeout: z.number().min(0).default(60),
        /** Kernel read-ahead in bytes (can only lower the kernel's default). */
        maxReadahead: sizeField().optional(),
      })
      .strict()
      .default({ attrTimeout: 60, entryTimeout: 60 }),
    fuseServer: z
      .object({
        /**
         * Serve the FUSE mounts from a separate process that outlives this one, so that a
         * restart of the snapshotter leaves running containers' layers readable.
         */
        enabled: z.boolean().default(true),
        /** A server with no mount and no snapshotter connected exits after this long. */
        idleExitSeconds: z.number().int().min(1).default(60),
      })
      .strict()
      .default({ enabled: true, idleExitSeconds: 60 }),
    metrics: z.object({ listen: listenAddress.optional() }).strict().default({}),
    log: z
      .object({
        level: z.enum(['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent']).default('info'),
      })
      .strict()
      .default({ level: 'info' }),
  })
  .strict();

export type SnapshotterConfig = z.output<typeof snapshotterConfigSchema>;
