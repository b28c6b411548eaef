import { z } from 'zod';
import { tlsFilesSchema } from '../common/tls.js';
import { DEFAULT_GRPC_LIMITS, grpcLimitsSchema } from '../rpc/grpc-listener.js';

export const topologyRuleSchema = z
  .object({
    key: z.string().min(1),
    weight: z.number().min(0),
    /** Never pick a parent across this key while one exists on the child's side. */
    strict: z.boolean().default(false),
  })
  .strict();

/**
 * The shape of the parent graph.
 *
 * - `adaptive` (the default): chains as in a pipeline, placed by what the scheduler measures from
 *   the peers' piece reports (placement.ts): a peer found slow rides at a chain's end instead of
 *   holding back the peers below it, a seed whose link carries several chains feeds several, a
 *   held-back chain moves to where there is room. On equal links it is the pipeline.
 * - `mesh`: each child gets up to `candidateParentLimit` parents and fetches pieces from several
 *   at once. It copes with children that want different pieces (lazy pulls reading files at
 *   random) and with uneven hosts, but max-min sharing of many thin transfers leaves uploads idle:
 *   on equal NICs the last node lands at 1.4-1.8 x T*.
 * - `pipeline`: each child gets one parent and fetches one piece at a time from it, and each
 *   peer feeds at most `fanout` children per task (`seedFanout` for seeds). With cut-through relays the
 *   graph becomes chains that forward every byte as it arrives, the pipelined broadcast that
 *   collective libraries use for large messages: on equal NICs every link runs at full rate and
 *   the last node lands near T*. A fan-out above what a host's upload can feed at the children's
 *   rate splits its upload and slows every chain below it, so set it to upload / download rate
 *   (1 on equal NICs; a seed with a 4 x faster NIC may feed 4).
 */
export const shapeSchema = z.enum(['adaptive', 'mesh', 'pipeline']);

/** How parents are chosen; the same shape the manager will push to running schedulers. */
export const schedulingSchema = z
  .object({
    shape: shapeSchema.default('adaptive'),
    pipeline: z
      .object({
        fanout: z.number().int().min(1).max(64).default(1),
        seedFanout: z.number().int().min(1).max(64).default(1),
      })
      .strict()
      .default({ fanout: 1, seedFanout: 1 }),
    candidateParentLimit: z.number().int().min(1).max(50).default(5),
    backToSourceLimit: z.number().int().min(0).max(1000).default(1),
    /** Rounds without a parent before a peer is sent to the origin whatever the limit. */
    retryLimit: z.number().int().min(1).max(100).default(5),
    topology: z.array(topologyRuleSchema).default([
      { key: 'zone', weight: 100, strict: true },
      { key: 'rack', weight: 50, strict: false },
    ]),
    weights: z
      .object({
        freeUpload: z.number().min(0).default(20),
        pieces: z.number().min(0).default(30),
        seed: z.number().min(0).default(10),
        failure: z.number().min(0).default(40),
      })
      .strict()
      .default({ freeUpload: 20, pieces: 30, seed: 10, failure: 40 }),
    /** A parent slower than this many times the median of the candidates is left out. */
    slowFactor: z.number().gt(1).default(4),
  })
  .strict();

export type SchedulingConfig = z.output<typeof schedulingSchema>;
export type TopologyRule = z.output<typeof topologyRuleSchema>;

export const defaultScheduling = (): SchedulingConfig => schedulingSchema.parse({});

/** The scheduler process: where it listens, and how it schedules. */
export const schedulerConfigSchema = z
  .object({
    listen: z.string().default('127.0.0.1:8002'),
    metricsListen: z.string().default('127.0.0.1:8003'),
    clusterTokenFile: z.string().optional(),
    /** The manager's base URL: the scheduler registers there and takes its cluster's settings from it. */
    manager: z.string().url().optional(),
    /** The scheduler cluster to join in the manager (default: the manager's default cluster). */
    clusterName: z.string().min(1).optional(),
    keepaliveIntervalMs: z.number().int().min(100).default(5_000),
    /** How often peers short of parents get another look. */
    tickMs: z.number().int().min(50).default(2_000),
    /** How long a task with no peer is remembered (with its piece digests). */
    taskTtlMs: z
      .number()
      .int()
      .min(0)
      .default(30 * 60_000),
    scheduling: schedulingSchema.default(defaultScheduling()),
    /** What one client of the gRPC port may hold: connections, streams, idle time (docs/security.md, "Limits"). */
    limits: grpcLimitsSchema.default(DEFAULT_GRPC_LIMITS),
    /** TLS on the gRPC port, and towards seeds and the manager (checked against `ca`). */
    tls: tlsFilesSchema.optional(),
    log: z
      .object({ level: z.enum(['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent']).default('info') })
      .strict()
      .default({ level: 'info' }),
  })
  .strict();

export type SchedulerConfig = z.output<typeof schedulerConfigSchema>;
