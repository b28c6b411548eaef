// containerd's snapshots.v1 gRPC service (proto/containerd/...) over a Snapshotter: request and
// response shapes, timestamps, and errors as gRPC status codes containerd understands.
import * as grpc from '@grpc/grpc-js';
import type { Logger } from '../common/log.js';
import { loadService } from '../rpc/proto.js';
import { grpcStatus, SnapshotError } from './errors.js';
import type { SnapshotInfo, Snapshotter } from './snapshotter.js';

export const SnapshotsService = () =>
  loadService('containerd/services/snapshots/v1/snapshots.proto', 'containerd.services.snapshots.v1.Snapshots');

interface Timestamp {
  seconds: number;
  nanos: number;
}
interface InfoMessage {
  name: string;
  parent: string;
  kind: string;
  createdAt: Timestamp | null;
  updatedAt: Timestamp | null;
  labels: Record<string, string>;
}
/*
 * Request messages as proto-loader presents them (`defaults: true`: every string, map and list
 * is there, empty when not sent; a message field not sent is null).
 */
interface KeyRequest {
  key: string;
}
interface CreateRequest extends KeyRequest {
  parent: string;
  labels: Record<string, string>;
}
interface CommitRequest extends KeyRequest {
  name: string;
  labels: Record<string, string>;
}
interface UpdateRequest {
  info: { name: string; labels: Record<string, string> } | null;
  updateMask: { paths: string[] } | null;
}
interface ListRequest {
  filters: string[];
}

const KIND = { active: 'ACTIVE', view: 'VIEW', committed: 'COMMITTED' } as const;

function toTimestamp(date: Date): Timestamp {
  const ms = date.getTime();
  return { seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1e6 };
}

function toMessage(info: SnapshotInfo): InfoMessage {
  return {
    name: info.name,
    parent: info.parent,
    kind: KIND[info.kind],
    createdAt: toTimestamp(info.created),
    updatedAt: toTimestamp(info.updated),
    labels: info.labels,
  };
}

/** The handlers, each logging what failed (NOT_FOUND is routine: containerd asks before it creates). */
export function snapshotsHandlers(sn: Snapshotter, log: Logger): grpc.UntypedServiceImplementation {
  const unary =
    <Req extends object>(name: string, handle: (req: Req) => unknown): grpc.handleUnaryCall<Req, unknown> =>
    (call, callback) => {
      Promise.resolve()
        .then(() => handle(call.request))
        .then(
          (response) => callback(null, response ?? {}),
          (error: Error) => {
            const code = grpcStatus(error);
            const routine = error instanceof SnapshotError && (error.code === 'NOT_FOUND' || error.code === 'ALREADY_EXISTS');
            const { key, name: snapshot } = call.request as { key?: string; name?: string };
            log[routine ? 'debug' : 'warn']({ rpc: name, key: key ?? snapshot, err: error.message }, 'request failed');
            callback({ code, details: error.message });
          },
        );
    };

  return {
    Prepare: unary('Prepare', async (r: CreateRequest) => ({ mounts: await sn.prepare(r.key, r.parent, r.labels ?? {}) })),
    View: unary('View', async (r: CreateRequest) => ({ mounts: await sn.view(r.key, r.parent, r.labels ?? {}) })),
    Mounts: unary('Mounts', async (r: KeyRequest) => ({ mounts: await sn.mounts(r.key) })),
    Commit: unary('Commit', (r: CommitRequest) => sn.commit(r.name, r.key, r.labels ?? {})),
    Remove: unary('Remove', (r: KeyRequest) => sn.remove(r.key)),
    Stat: unary('Stat', (r: KeyRequest) => ({ info: toMessage(sn.stat(r.key)) })),
    Update: unary('Update', (r: UpdateRequest) => {
      if (!r.info?.name) throw new SnapshotError('INVALID_ARGUMENT', 'Update needs info.name');
      return { info: toMessage(sn.update({ name: r.info.name, labels: r.info.labels ?? {} }, r.updateMask?.paths ?? [])) };
    }),
    Usage: unary('Usage', async (r: KeyRequest) => sn.usage(r.key)),
    Cleanup: unary('Cleanup', () => sn.cleanup()),
    List: (call: grpc.ServerWritableStream<ListRequest, unknown>) => {
      try {
        const infos = sn.list(call.request.filters ?? []).map(toMessage);
        // Batches keep each message well under gRPC's default 4 MiB limit.
        for (let i = 0; i < infos.length; i += 100) call.write({ info: infos.slice(i, i + 100) });
        call.end();
      } catch (error) {
        call.emit('error', { code: grpcStatus(error), details: (error as Error).message }); // grpc-js: ends the stream with this status
      }
    },
  };
}
