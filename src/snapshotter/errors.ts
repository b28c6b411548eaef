// Errors the snapshotter answers with. containerd maps gRPC status codes back to its errdefs
// (AlreadyExists, NotFound, FailedPrecondition, ...), and the unpacker depends on them: an
// ALREADY_EXISTS from Prepare is how a remote snapshotter says "this layer needs no download".
import { status } from '@grpc/grpc-js';

export type SnapshotErrorCode = 'NOT_FOUND' | 'ALREADY_EXISTS' | 'FAILED_PRECONDITION' | 'INVALID_ARGUMENT' | 'UNAVAILABLE';

export class SnapshotError extends Error {
  override name = 'SnapshotError';
  constructor(
    readonly code: SnapshotErrorCode,
    message: string,
  ) {
    super(message);
  }
}

export const notFound = (what: string) => new SnapshotError('NOT_FOUND', `${what}: not found`);
export const alreadyExists = (what: string) => new SnapshotError('ALREADY_EXISTS', `${what}: already exists`);

/** The gRPC status for an error thrown by the snapshotter (anything unexpected is UNKNOWN). */
export function grpcStatus(error: unknown): status {
  if (!(error instanceof SnapshotError)) return status.UNKNOWN;
  return status[error.code];
}
