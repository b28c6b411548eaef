/** containerd remote snapshotter: eStargz layers mounted lazily through FUSE, ordinary overlay snapshots otherwise. */
export { startSnapshotter, type RunningSnapshotter } from './daemon.js';
export { snapshotterConfigSchema, type SnapshotterConfig } from './config.js';
export { SnapshotsService } from './grpc-service.js';
export { startFuseServer, type RunningFuseServer } from './fuse-server/server.js';
