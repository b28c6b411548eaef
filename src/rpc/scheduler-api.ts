/**
 * TypeScript shapes of proto/starling/scheduler/v1/scheduler.proto as @grpc/proto-loader
 * presents them (camelCase fields, int64 as numbers, enums as strings, oneof names in `packet`).
 */
import type * as grpc from '@grpc/grpc-js';

export interface HostInfo {
  id: string;
  hostname: string;
  ip: string;
  uploadPort: number;
  labels: Record<string, string>;
  seed: boolean;
  uploadBandwidth: number;
  uploadSlots: number;
  uploadInUse: number;
}

export interface AnnounceHostRequest {
  host: HostInfo;
}
export interface AnnounceHostResponse {
  keepaliveIntervalMs: number;
}
export interface LeaveHostRequest {
  hostId: string;
}
export type LeaveHostResponse = Record<string, never>;

export interface OriginRequest {
  /** The registry's blob URL. */
  url: string;
  /** Never set by peers: registry credentials do not go to the scheduler (a register carrying any is refused). */
  headers?: Record<string, string>;
  /** The registry serves the blob without credentials, so a seed may fetch it. */
  public?: boolean;
}

export interface RegisterPeer {
  peerId: string;
  hostId: string;
  taskId: string;
  contentLength: number;
  pieceSize: number;
  origin?: OriginRequest | null;
  heldPieces: number[];
}

export interface PieceStarted {
  index: number;
  /** Only background readers want the piece: no workload waits for it (absent: one does). */
  background?: boolean;
  /**
   * The parent whose bytes these are (absent or empty: the origin). A piece asked of a parent just before
   * the scheduler moved the peer arrives after the move: judged against the new parent, it would
   * show that parent's child as slow.
   */
  parentId?: string;
}

export interface PieceFinished {
  index: number;
  digest: string;
  parentId: string;
  costMs: number;
  fromOrigin: boolean;
  length: number;
}

export type FailureReason =
  | 'FAILURE_REASON_UNSPECIFIED'
  | 'FAILURE_REASON_PARENT_UNREACHABLE'
  | 'FAILURE_REASON_BAD_PIECE'
  | 'FAILURE_REASON_PARENT_SLOW'
  | 'FAILURE_REASON_PIECE_MISSING';

export interface PieceFailed {
  index: number;
  parentId: string;
  reason: FailureReason;
  message: string;
}

export type PeerPacket =
  | { packet: 'register'; register: RegisterPeer }
  | { packet: 'pieceStarted'; pieceStarted: PieceStarted }
  | { packet: 'pieceFinished'; pieceFinished: PieceFinished }
  | { packet: 'pieceFailed'; pieceFailed: PieceFailed }
  | { packet: 'reschedule'; reschedule: { blocklist: string[] } }
  | { packet: 'idle'; idle: Record<string, never> }
  | { packet: 'spanRead'; spanRead: Record<string, never> }
  | { packet: 'downloadFinished'; downloadFinished: Record<string, never> }
  | { packet: 'downloadFailed'; downloadFailed: DownloadFailed };

export interface DownloadFailed {
  message: string;
  /** The whole blob did not match its digest: what the peer read from the origin may be a lie. */
  contentMismatch?: boolean;
}

export interface ParentInfo {
  peerId: string;
  hostId: string;
  ip: string;
  uploadPort: number;
  seed: boolean;
  /** Most pieces to fetch from this parent at once; 0 (or absent, from an older scheduler): the child's own limit. */
  piecesAtOnce?: number;
}

export type SchedulerPacket =
  | { packet: 'parents'; parents: { parents: ParentInfo[] } }
  | { packet: 'digests'; digests: PieceDigests }
  | { packet: 'backToSource'; backToSource: { reason: string } }
  | { packet: 'wait'; wait: { reason: string; spanSources?: ParentInfo[] } }
  | { packet: 'swarmReading'; swarmReading: { onDemand: boolean } };

export interface PieceDigests {
  digests: Record<number, string>;
  /**
   * Digests of a blob that verified whole on some peer: a piece matching one is verified. Without
   * it, digests are vouched for by an origin reader: the registry's word, good for checking
   * transfers between peers, not for serving a piece to a later request as verified.
   */
  confirmed?: boolean;
  /** Forget every digest not confirmed first: a peer's whole blob failed its digest, so any may be a lie. */
  forgetVouched?: boolean;
}

export interface PeerStat {
  peerId: string;
  hostId: string;
  pieces: number;
  parents: string[];
  backToSource: boolean;
  seed: boolean;
  finished: boolean;
  bytesByParentHost: Record<string, number>;
  labels: Record<string, string>;
}

export interface TaskStat {
  taskId: string;
  registry: string;
  contentLength: number;
  pieceCount: number;
  /** Pieces with a digest: vouched for by an origin reader, or confirmed. */
  trustedDigests: number;
  /** Pieces whose digest a peer's verified whole blob confirmed. */
  confirmedDigests: number;
  peers: PeerStat[];
  bytesFromPeers: number;
  bytesFromSeeds: number;
  bytesFromOrigin: number;
  cyclesDetected: number;
}

/** A client of the Scheduler service as proto-loader builds it: the calls the peer makes. */
export interface SchedulerServiceClient extends grpc.Client {
  AnnounceHost(
    request: AnnounceHostRequest,
    metadata: grpc.Metadata,
    options: grpc.CallOptions,
    callback: grpc.requestCallback<AnnounceHostResponse>,
  ): grpc.ClientUnaryCall;
  AnnounceHost(request: AnnounceHostRequest, callback: grpc.requestCallback<AnnounceHostResponse>): grpc.ClientUnaryCall;
  AnnounceHost(
    request: AnnounceHostRequest,
    metadata: grpc.Metadata,
    callback: grpc.requestCallback<AnnounceHostResponse>,
  ): grpc.ClientUnaryCall;
  LeaveHost(
    request: LeaveHostRequest,
    metadata: grpc.Metadata,
    options: grpc.CallOptions,
    callback: grpc.requestCallback<LeaveHostResponse>,
  ): grpc.ClientUnaryCall;
  AnnouncePeer(metadata?: grpc.Metadata): grpc.ClientDuplexStream<PeerPacket, SchedulerPacket>;
}
