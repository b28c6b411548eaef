import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { fileURLToPath } from 'node:url';
import type { ClientTls, ClusterTls } from '../common/tls.js';
import type { SchedulerServiceClient } from './scheduler-api.js';

/** The repository's proto/ folder: two levels above both src/rpc and dist/rpc. */
export const PROTO_ROOT = fileURLToPath(new URL('../../proto/', import.meta.url));

const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: false,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
  includeDirs: [PROTO_ROOT],
};

/** Loads a service definition from a .proto file under proto/. */
export function loadService(protoFile: string, servicePath: string): grpc.ServiceClientConstructor {
  const definition = protoLoader.loadSync(protoFile, LOADER_OPTIONS);
  const loaded = grpc.loadPackageDefinition(definition);
  let node: unknown = loaded;
  for (const part of servicePath.split('.')) node = (node as Record<string, unknown>)[part];
  if (typeof node !== 'function') throw new Error(`service ${servicePath} not found in ${protoFile}`);
  return node as grpc.ServiceClientConstructor;
}

export const SchedulerService = () => loadService('starling/scheduler/v1/scheduler.proto', 'starling.scheduler.v1.Scheduler');

/**
 * Channel credentials towards a scheduler: TLS checked against the cluster CA when the cluster
 * uses it (the chain, not the name: see common/tls.ts), plain HTTP/2 otherwise.
 */
export function schedulerCredentials(tls: ClientTls | undefined): grpc.ChannelCredentials {
  if (!tls) return grpc.credentials.createInsecure();
  return grpc.credentials.createSsl(tls.ca, tls.key, tls.cert, { checkServerIdentity: () => undefined });
}

/** Server credentials of the scheduler's gRPC port. */
export function schedulerServerCredentials(tls: ClusterTls | undefined): grpc.ServerCredentials {
  if (!tls) return grpc.ServerCredentials.createInsecure();
  return grpc.ServerCredentials.createSsl(tls.ca, [{ private_key: tls.key, cert_chain: tls.cert }], false);
}

/** The Scheduler service's client class: proto-loader builds it untyped; this names the calls' types. */
export const SchedulerClientClass = () =>
  SchedulerService() as unknown as new (
    address: string,
    credentials: grpc.ChannelCredentials,
    options?: grpc.ClientOptions,
  ) => SchedulerServiceClient;
