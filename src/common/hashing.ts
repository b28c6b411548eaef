// Digests that run on the libuv thread pool (native/digest) instead of the JavaScript thread. A
// peer pulling a blob hashes every byte at least once (the whole-blob digest) and checks every
// piece; on the JavaScript thread that cost ~1.6 s per GB, time it could not spend moving bytes.
// Without the addon everything falls back to node:crypto and node:zlib on this thread.
import { createHash } from 'node:crypto';
import { optionalAddon } from './native-addon.js';

interface NativeHasher {
  update(bytes: Uint8Array): Promise<void>;
  hex(): string;
}

interface DigestAddon {
  Hasher: new (algorithm: string) => NativeHasher;
  sha256(bytes: Uint8Array): Promise<string>;
  crc32c(bytes: Uint8Array): Promise<number>;
}

/** Without the addon, everything hashes on this thread. */
const loadAddon = () => optionalAddon<DigestAddon>('digest', 'starling_digest');

/** Whether digests run off the JavaScript thread (and CRC-32C is available). */
export function offThreadHashing(): boolean {
  return loadAddon() !== null;
}

/**
 * An incremental digest. Updates run one at a time, in the order they are called; a buffer must
 * not change until its update has resolved.
 */
export interface StreamingHash {
  update(bytes: Uint8Array): Promise<void>;
  /** The digest as lowercase hex, once every update has resolved. */
  hex(): string;
}

export function createStreamingHash(algorithm: string): StreamingHash {
  const native = loadAddon();
  if (!native) {
    const hash = createHash(algorithm);
    return {
      update: async (bytes) => void hash.update(bytes),
      hex: () => hash.digest('hex'),
    };
  }
  const hasher = new native.Hasher(algorithm);
  let queue: Promise<void> = Promise.resolve();
  return {
    update(bytes) {
      queue = queue.then(() => hasher.update(bytes));
      return queue;
    },
    hex: () => hasher.hex(),
  };
}

/** SHA-256 of `bytes` as lowercase hex. */
export function sha256Hex(bytes: Uint8Array): Promise<string> {
  const native = loadAddon();
  return native ? native.sha256(bytes) : Promise.resolve(createHash('sha256').update(bytes).digest('hex'));
}

/** CRC-32C (Castagnoli) of `bytes`, or undefined without the addon (Node has no CRC-32C of its own). */
export function crc32c(bytes: Uint8Array): Promise<number> | undefined {
  return loadAddon()?.crc32c(bytes);
}
