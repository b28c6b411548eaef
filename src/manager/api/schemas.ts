import { z } from 'zod';
import { clusterNameSchema } from '../../rpc/manager-api.js';
import { countField as count } from '../../rpc/wire.js';
import { schedulingSchema } from '../../scheduler/config.js';
import { clusterScopesPatchSchema, clusterScopesSchema } from '../services/scopes.js';

/*
 * Request and response shapes of the REST API. Requests are strict (an unknown field is an
 * error that names it); responses are here for the OpenAPI document and the tests that hold the
 * answers to it.
 */

const time = z.string().describe('ISO 8601 time');

export const idParams = z.object({ id: z.coerce.number().int().min(1) }).strict();

export const errorSchema = z.object({ error: z.object({ code: z.string(), message: z.string() }) }).describe('Error');

// Clusters

export const clusterSchema = z.object({
  id: z.number().int(),
  name: z.string(),
  config: schedulingSchema,
  configVersion: z.number().int(),
  scopes: clusterScopesSchema,
  isDefault: z.boolean(),
  createdAt: time,
  updatedAt: time,
});

export const createClusterBody = z
  .object({
    name: clusterNameSchema,
    config: schedulingSchema.optional(),
    scopes: clusterScopesSchema.optional(),
    isDefault: z.boolean().optional(),
  })
  .strict();

export const updateClusterBody = z
  .object({
    name: clusterNameSchema.optional(),
    scopes: clusterScopesPatchSchema.optional(),
    isDefault: z.boolean().optional(),
  })
  .strict();

/** Validated as a whole by schedulingSchema after merging into the current settings. */
export const clusterConfigPatchBody = z.record(z.string(), z.unknown());

// Schedulers and peers

export const schedulerKeepaliveAnswer = z.object({
  clusterId: z.number().int(),
  config: schedulingSchema,
  configVersion: z.number().int(),
});

export const peerKeepaliveAnswer = z.object({
  clusterId: z.number().int(),
  schedulers: z.array(z.string()).describe('ip:port of the active schedulers'),
});

export const schedulerSchema = z.object({
  id: z.number().int(),
  clusterId: z.number().int(),
  hostname: z.string(),
  ip: z.string(),
  port: z.number().int(),
  address: z.string(),
  state: z.enum(['active', 'inactive']),
  lastKeepalive: time,
  createdAt: time,
});

export const schedulerQuery = z
  .object({ clusterId: z.coerce.number().int().optional(), state: z.enum(['active', 'inactive']).optional() })
  .strict();

export const peerSchema = z.object({
  id: z.number().int(),
  clusterId: z.number().int(),
  hostId: z.string(),
  hostname: z.string(),
  ip: z.string(),
  uploadPort: z.number().int(),
  mirrorUrl: z.string(),
  labels: z.record(z.string(), z.string()),
  type: z.enum(['normal', 'seed']),
  state: z.enum(['active', 'inactive']),
  lastKeepalive: time,
  silentForSeconds: count,
  tasks: z.object({ count, complete: count, bytesFromPeers: count, bytesFromSeeds: count, bytesFromOrigin: count }),
  createdAt: time,
});

export const peerQuery = z
  .object({
    clusterId: z.coerce.number().int().optional(),
    state: z.enum(['active', 'inactive']).optional(),
    type: z.enum(['normal', 'seed']).optional(),
    zone: z.string().optional(),
  })
  .strict();

export const taskSchema = z.object({
  digest: z.string(),
  size: count,
  peers: z.array(z.object({ hostId: z.string(), complete: z.boolean() })),
  bytesFromPeers: count,
  bytesFromSeeds: count,
  bytesFromOrigin: count,
});

export const limitQuery = z.object({ limit: z.coerce.number().int().min(1).max(1000).default(100) }).strict();

// Users and tokens

export const roleSchema = z.enum(['admin', 'read-only']);

export const userSchema = z.object({ id: z.number().int(), name: z.string(), role: roleSchema, createdAt: time });

export const createUserBody = z
  .object({
    name: z
      .string()
      .min(1)
      .max(100)
      .regex(/^[A-Za-z0-9][A-Za-z0-9._@-]*$/, 'must be letters, digits, . _ @ -'),
    role: roleSchema,
  })
  .strict();

export const meSchema = z.object({ user: userSchema, tokenId: z.number().int() });

export const tokenSchema = z.object({
  id: z.number().int(),
  userId: z.number().int(),
  userName: z.string(),
  name: z.string(),
  createdAt: time,
  expiresAt: time.nullable(),
});

export const createdTokenSchema = tokenSchema.extend({ token: z.string().describe('shown only in this answer') });

export const createTokenBody = z
  .object({
    name: z.string().min(1).max(100),
    /** Whose token; default: the caller. */
    userId: z.number().int().min(1).optional(),
    expiresInDays: z.number().int().min(1).max(3650).optional(),
  })
  .strict();

// Jobs

export const preheatBody = z
  .object({
    type: z.literal('preheat'),
    image: z.string().min(1).max(1024).describe('registry/repository:tag or @digest'),
    platform: z.string().min(1).default('linux/amd64'),
    scope: z
      .string()
      .regex(/^(seeds|all-peers|zone:.+)$/, 'must be "seeds", "all-peers" or "zone:<zone>"')
      .default('seeds'),
    credentials: z
      .object({ username: z.string().min(1), password: z.string() })
      .strict()
      .optional(),
    insecure: z.boolean().optional().describe('reach the registry over plain HTTP (loopback registries always are)'),
  })
  .strict();

const jobState = z.enum(['pending', 'running', 'succeeded', 'failed']);

export const jobSchema = z.object({
  id: z.number().int(),
  type: z.string(),
  state: jobState,
  args: z.record(z.string(), z.unknown()),
  result: z.record(z.string(), z.unknown()).nullable(),
  error: z.string().nullable(),
  createdBy: z.string(),
  createdAt: time,
  updatedAt: time,
  owner: z.string().nullable().describe('the manager replica that runs the job, or ran it last'),
  takeovers: count.describe('how many times a replica took the job over from one that died or stopped'),
  progress: z.object({ tasks: count, pending: count, running: count, succeeded: count, failed: count, bytes: count, totalBytes: count }),
  layers: z.array(z.object({ digest: z.string(), size: count, peers: count, succeeded: count, failed: count, bytes: count })),
  tasks: z
    .array(
      z.object({
        digest: z.string(),
        hostId: z.string(),
        peerAddress: z.string(),
        state: jobState,
        size: count,
        bytes: count,
        error: z.string().nullable(),
        updatedAt: time,
      }),
    )
    .optional(),
});

export const jobQuery = z.object({ state: jobState.optional(), limit: z.coerce.number().int().min(1).max(1000).default(100) }).strict();

// Audit and overview

export const auditSchema = z.object({
  id: z.number().int(),
  actor: z.string(),
  action: z.string(),
  target: z.string(),
  detail: z.record(z.string(), z.unknown()),
  at: time,
});

export const auditQuery = z
  .object({
    limit: z.coerce.number().int().min(1).max(1000).default(100),
    before: z.coerce.number().int().min(1).optional(),
    action: z.string().optional(),
    actor: z.string().optional(),
  })
  .strict();

export const overviewSchema = z.object({
  clusters: count,
  schedulers: z.object({ active: count, inactive: count }),
  peers: z.object({ active: count, inactive: count, seeds: count }),
  jobs: z.object({ pending: count, running: count, succeeded: count, failed: count }),
  tasks: count,
  bytes: z.object({ fromPeers: count, fromSeeds: count, fromOrigin: count, p2pRatio: z.number().nullable() }),
});
