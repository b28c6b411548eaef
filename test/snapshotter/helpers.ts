// Plumbing for the snapshotter tests: a gRPC client for its socket and the FUSE mounts it made
// (the process itself: test/fixtures/snapshotter.ts).
import fs from 'node:fs';
import * as grpc from '@grpc/grpc-js';
import { SnapshotsService } from '../../src/snapshotter/index.js';
import { mountsUnder } from '../fixtures/processes.js';

export type SnapshotsClient = grpc.Client & Record<string, (...args: any[]) => any>;

export function snapshotsClient(socket: string): SnapshotsClient {
  const Service = SnapshotsService();
  return new Service(`unix:${socket}`, grpc.credentials.createInsecure()) as unknown as SnapshotsClient;
}

/** A unary call as a promise; rejects with the grpc error (its `code` is the status). */
export function call<T = any>(client: SnapshotsClient, method: string, req: object): Promise<T> {
  const rpc = methodOf(client, method);
  return new Promise((resolve, reject) =>
    rpc.call(client, req, (error: grpc.ServiceError | null, res: T) => (error ? reject(error) : resolve(res))),
  );
}

function methodOf(client: SnapshotsClient, method: string): (...args: any[]) => any {
  const rpc = client[method];
  if (!rpc) throw new Error(`the snapshots service has no method ${method}`);
  return rpc;
}

export function list(client: SnapshotsClient, filters: string[] = []): Promise<any[]> {
  return new Promise((resolve, reject) => {
    const infos: any[] = [];
    const stream = methodOf(client, 'List').call(client, { filters });
    stream.on('data', (m: { info: any[] }) => infos.push(...m.info));
    stream.on('error', reject);
    stream.on('end', () => resolve(infos));
  });
}

/** FUSE mounts below `dir` and whether each answers (statfs in a child: never block on a dead mount here). */
export function fuseMountsUnder(dir: string): string[] {
  const lines = fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n');
  return mountsUnder(dir).filter((p) => lines.some((l) => l.split(' ')[4] === p && / - fuse/.test(l)));
}
