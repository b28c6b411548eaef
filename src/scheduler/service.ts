import * as grpc from '@grpc/grpc-js';
import type { Logger } from '../common/log.js';
import type { ClusterToken } from '../common/token.js';
import { checkHost, checkPeerPacket, checkRegister } from '../rpc/scheduler-checks.js';
import type {
  AnnounceHostRequest,
  HostInfo,
  AnnounceHostResponse,
  LeaveHostRequest,
  PeerPacket,
  SchedulerPacket,
  TaskStat,
} from '../rpc/scheduler-api.js';
import type { Peer } from './resources.js';
import type { Scheduling } from './scheduling.js';
import type { SchedulerMetrics } from './metrics.js';

/** Checks the cluster token that every call must carry, in constant time. */
export function authorized(metadata: grpc.Metadata, token: ClusterToken | undefined): boolean {
  if (!token) return true;
  const value = metadata.get('authorization')[0];
  return token.accepts(typeof value === 'string' ? value : undefined);
}

const unauthenticated = { code: grpc.status.UNAUTHENTICATED, details: 'missing or wrong cluster token' };

/** The gRPC face of the scheduling engine. */
export function schedulerHandlers(
  scheduling: Scheduling,
  options: { keepaliveIntervalMs: number; clusterToken?: ClusterToken; metrics: SchedulerMetrics; log: Logger },
): grpc.UntypedServiceImplementation {
  const { log, metrics, clusterToken } = options;
  return {
    AnnounceHost(
      call: grpc.ServerUnaryCall<AnnounceHostRequest, AnnounceHostResponse>,
      callback: grpc.sendUnaryData<AnnounceHostResponse>,
    ) {
      if (!authorized(call.metadata, clusterToken)) return callback(unauthenticated);
      let info: HostInfo;
      try {
        info = checkHost(call.request.host);
      } catch (error) {
        return callback({ code: grpc.status.INVALID_ARGUMENT, details: (error as Error).message });
      }
      scheduling.announceHost(info);
      callback(null, { keepaliveIntervalMs: options.keepaliveIntervalMs });
    },

    LeaveHost(call: grpc.ServerUnaryCall<LeaveHostRequest, object>, callback: grpc.sendUnaryData<object>) {
      if (!authorized(call.metadata, clusterToken)) return callback(unauthenticated);
      const host = scheduling.resources.hosts.get(call.request.hostId);
      if (host) scheduling.removeHost(host);
      callback(null, {});
    },

    AnnouncePeer(call: grpc.ServerDuplexStream<PeerPacket, SchedulerPacket>) {
      if (!authorized(call.metadata, clusterToken)) {
        call.destroy(Object.assign(new Error(unauthenticated.details), unauthenticated));
        return;
      }
      let peer: Peer | undefined;
      const send = (packet: SchedulerPacket) => {
        if (!call.writableEnded && !call.destroyed) call.write(packet);
      };
      const fail = (code: grpc.status, details: string) => {
        log.warn({ peer: peer?.id, details }, 'closing peer stream');
        call.emit('error', Object.assign(new Error(details), { code, details }));
        call.end();
      };
      call.on('data', (packet: PeerPacket) => {
        try {
          if (!peer) {
            if (packet.packet !== 'register') return fail(grpc.status.FAILED_PRECONDITION, 'the first packet must be register');
            peer = scheduling.register(checkRegister(packet.register), send, (reason) => fail(grpc.status.UNAVAILABLE, reason));
            return;
          }
          checkPeerPacket(packet);
          switch (packet.packet) {
            case 'register':
              return fail(grpc.status.FAILED_PRECONDITION, 'register sent twice on one stream');
            case 'pieceStarted':
              return scheduling.pieceStarted(peer, packet.pieceStarted.index, {
                background: packet.pieceStarted.background === true,
                parentId: packet.pieceStarted.parentId || undefined,
              });
            case 'pieceFinished':
              return scheduling.pieceFinished(peer, packet.pieceFinished);
            case 'pieceFailed':
              metrics.pieceFailures.inc({ reason: packet.pieceFailed.reason });
              return scheduling.pieceFailed(peer, packet.pieceFailed);
            case 'reschedule':
              return scheduling.reschedule(peer, packet.reschedule.blocklist ?? []);
            case 'idle':
              return scheduling.idle(peer);
            case 'spanRead':
              return scheduling.spanRead(peer);
            case 'downloadFinished':
              return scheduling.finished(peer);
            case 'downloadFailed':
              log.info({ peer: peer.id, message: packet.downloadFailed.message }, 'peer download failed');
              if (packet.downloadFailed.contentMismatch) scheduling.contentMismatch(peer);
              return scheduling.leave(peer);
          }
        } catch (error) {
          fail(grpc.status.INVALID_ARGUMENT, (error as Error).message);
        }
      });
      const close = () => {
        if (peer) scheduling.leave(peer);
        peer = undefined;
      };
      call.on('end', () => {
        close();
        call.end();
      });
      call.on('cancelled', close);
      call.on('error', close);
      call.on('close', close);
    },

    StatTask(call: grpc.ServerUnaryCall<{ taskId: string; registry?: string }, TaskStat>, callback: grpc.sendUnaryData<TaskStat>) {
      if (!authorized(call.metadata, clusterToken)) return callback(unauthenticated);
      const stat = scheduling.stat(call.request.taskId, call.request.registry || undefined);
      if (!stat) return callback({ code: grpc.status.NOT_FOUND, details: `no task ${call.request.taskId}` });
      callback(null, stat);
    },
  };
}
