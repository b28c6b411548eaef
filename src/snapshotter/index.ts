/** containerd remote snapshotter: eStargz layers mounted lazily through FUSE, ordinary overlay snapshots otherwise. */
export { startSnapshotter } from './daemon.js';
export { snapshotterConfigSchema } from './config.js';
export { SnapshotsService } from './grpc-service.js';
export { startFuseServer } from './fuse-server/server.js';
