import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import { ZSTD_MODULE_PATH } from './zstd.js';

/** One gzip member to compress; digestLength leading bytes are a chunk whose sha256 is wanted. */
export interface MemberJob {
  data: Uint8Array;
  digestLength: number;
}

export interface MemberResult {
  compressed: Uint8Array;
  /** "sha256:..." of the first digestLength bytes, when digestLength > 0. */
  digest?: string;
}

/*
 * The worker's code is plain JavaScript evaluated in the thread (eval: true) rather than a
 * module file: worker threads do not inherit tsx's loader, so a .ts worker would not load under
 * the test runner, while this runs the same from src/ and dist/. zlib and libzstd output is
 * deterministic for a given level, so which worker compresses a member does not change the blob.
 * zstd-napi is required by absolute path: an eval'd worker resolves modules from the cwd.
 */
const WORKER_SOURCE = `
const { parentPort, workerData } = require('node:worker_threads');
const { gzipSync } = require('node:zlib');
const { createHash } = require('node:crypto');
let zstd;
if (workerData.format === 'zstd') {
  zstd = new (require(workerData.zstdPath).Compressor)();
  zstd.setParameters({ compressionLevel: workerData.level });
}
parentPort.on('message', ({ id, members }) => {
  try {
    const transfer = [];
    const results = members.map(({ data, digestLength }) => {
      let compressed = zstd ? zstd.compress(data) : gzipSync(data, { level: workerData.level });
      if (compressed.byteOffset !== 0 || compressed.byteLength !== compressed.buffer.byteLength) {
        compressed = new Uint8Array(compressed); // own the memory so it can be transferred
      }
      transfer.push(compressed.buffer);
      const digest = digestLength > 0
        ? 'sha256:' + createHash('sha256').update(data.subarray(0, digestLength)).digest('hex')
        : undefined;
      return { compressed, digest };
    });
    parentPort.postMessage({ id, results }, transfer);
  } catch (error) {
    parentPort.postMessage({ id, error: String((error && error.message) || error) });
  }
});
`;

interface Pending {
  resolve(results: MemberResult[]): void;
  reject(error: Error): void;
}

/** Each member becomes its own gzip member or zstd frame. */
export type MemberFormat = 'gzip' | 'zstd';

/** Compression (and chunk hashing) on worker threads, one batch of members per message. */
export class CompressionPool {
  private readonly workers: Worker[] = [];
  private readonly idle: Worker[] = [];
  private readonly queue: { id: number; members: MemberJob[] }[] = [];
  private readonly pending = new Map<number, Pending>();
  private readonly busy = new Map<Worker, number>();
  private nextId = 0;
  private failure: Error | undefined;

  constructor(level: number, workers = availableParallelism(), format: MemberFormat = 'gzip') {
    const count = Math.max(1, Math.floor(workers));
    for (let i = 0; i < count; i++) {
      const worker = new Worker(WORKER_SOURCE, { eval: true, workerData: { level, format, zstdPath: ZSTD_MODULE_PATH } });
      worker.on('message', (message: { id: number; results: MemberResult[] } | { id: number; error: string }) => {
        this.busy.delete(worker);
        const pending = this.pending.get(message.id);
        this.pending.delete(message.id);
        if ('error' in message) pending?.reject(new Error(`compression failed: ${message.error}`));
        else pending?.resolve(message.results);
        this.idle.push(worker);
        this.dispatch();
      });
      worker.on('error', (error) => this.fail(error));
      worker.on('exit', (code) => {
        if (code !== 0) this.fail(new Error(`compression worker exited with code ${code}`));
      });
      this.workers.push(worker);
      this.idle.push(worker);
    }
  }

  get size(): number {
    return this.workers.length;
  }

  /** Compresses each member into its own gzip stream or zstd frame; the buffers are transferred (detached). */
  compress(members: MemberJob[]): Promise<MemberResult[]> {
    if (this.failure) return Promise.reject(this.failure);
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.queue.push({ id, members });
      this.dispatch();
    });
  }

  async close(): Promise<void> {
    this.failure ??= new Error('compression pool closed');
    await Promise.all(this.workers.map((worker) => worker.terminate()));
  }

  private dispatch(): void {
    for (;;) {
      const worker = this.idle.at(-1);
      const job = this.queue[0];
      if (!worker || !job) return;
      this.idle.pop();
      this.queue.shift();
      this.busy.set(worker, job.id);
      worker.postMessage(
        job,
        job.members.map((m) => m.data.buffer as ArrayBuffer),
      );
    }
  }

  private fail(error: Error): void {
    if (this.failure) return;
    this.failure = error;
    for (const pending of this.pending.values()) pending.reject(error);
    this.pending.clear();
  }
}
