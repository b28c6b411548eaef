/**
 * The manager's HTTP contract with peers and schedulers, shared by both sides: the manager validates what it
 * receives with these schemas (its REST routes, src/manager/api/), the peer builds the types.
 */
import { z } from 'zod';
import { countField, digestField, ipField, portField } from './wire.js';

/** A scheduler cluster's name, as a scheduler asks to join it and as the manager's API takes it. */
export const clusterNameSchema = z
  .string()
  .min(1, 'must not be empty')
  .max(100)
  .regex(/^[A-Za-z0-9][A-Za-z0-9._-]*$/, 'must be letters, digits, . _ - (starting with a letter or digit)');

/** `POST` a SchedulerKeepalive: the scheduler is alive, where it listens, the cluster it joins (default: the default one). */
export const SCHEDULER_KEEPALIVE_PATH = '/api/v1/schedulers/keepalive';

export const schedulerKeepaliveSchema = z
  .object({
    hostname: z.string().min(1).max(255),
    ip: ipField,
    port: portField,
    clusterName: clusterNameSchema.optional(),
  })
  .strict();
export type SchedulerKeepalive = z.output<typeof schedulerKeepaliveSchema>;

/** A task a peer holds, with where its bytes came from. */
export const peerTaskReportSchema = z
  .object({
    digest: digestField,
    size: countField,
    complete: z.boolean(),
    bytesFrom: z.object({ peer: countField, seed: countField, origin: countField }).strict(),
  })
  .strict();
export type PeerTaskReport = z.output<typeof peerTaskReportSchema>;

/** `POST` a PeerKeepalive: the peer is alive, where it listens, and (now and then) what it holds. */
export const PEER_KEEPALIVE_PATH = '/api/v1/peers/keepalive';

export const peerKeepaliveSchema = z
  .object({
    hostId: z.string().min(1).max(255),
    hostname: z.string().min(1).max(255),
    ip: ipField,
    uploadPort: portField,
    mirrorUrl: z.string().max(2048),
    labels: z.record(z.string().max(255), z.string().max(255)).default({}),
    seed: z.boolean().default(false),
    /** Replaces the peer's previous report; left out, the old one stays. */
    tasks: z.array(peerTaskReportSchema).max(100_000).optional(),
  })
  .strict();
export type PeerKeepalive = z.output<typeof peerKeepaliveSchema>;
