import { createStreamingHash, type StreamingHash } from '../common/hashing.js';
import type { Logger } from '../common/log.js';
import { parseDigest } from '../oci/digest.js';
import type { ReadPriority } from '../rpc/mirror-api.js';
import { checkSha256, pieceCheck, type PieceCheckKind } from '../storage/piece-check.js';
import type { BlobStore } from '../storage/blob-store.js';
import { pieceBounds, type PieceLayout } from '../storage/piece-plan.js';
import type { StoredBlob } from '../storage/stored-blob.js';
import { GrowingPiece } from './growing-piece.js';
import { pieceBuffers } from './piece-buffers.js';
import {
  BlobSizeMismatchError,
  UpstreamStatusError,
  type PieceOrigin,
  type PieceProvenance,
  type PieceRun,
  type PieceSource,
} from './sources/piece-source.js';

export class BlobDigestMismatchError extends Error {
  override name = 'BlobDigestMismatchError';
}

/** The whole-blob hash could not go on: a stored piece could not be read back or hashed. */
export class BlobHashError extends Error {
  override name = 'BlobHashError';
}

export interface TaskEvents {
  pieceStored(task: BlobTask, index: number, bytes: number, provenance: PieceProvenance): void;
  /** A piece started arriving: its bytes may be relayed before it is stored. */
  pieceGrowing?(task: BlobTask, index: number): void;
  verified(task: BlobTask): void;
  failed(task: BlobTask, error: Error): void;
}

interface Deferred {
  promise: Promise<void>;
  resolve(): void;
  reject(error: Error): void;
}

function deferred(): Deferred {
  let resolve!: () => void;
  let reject!: (error: Error) => void;
  const promise = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  promise.catch(() => undefined); // a waiter may never come
  return { promise, resolve, reject };
}

const RETRIES_PER_RUN = 3;
/** Bytes of recent pieces a task keeps in memory, and the most pieces it may keep to finish its hash. */
const RECENT_BYTES = 16 * 1024 * 1024;
const RECENT_PIECES_MAX = 16;

/**
 * One blob being served and fetched. The task id is the blob digest. It makes sure each missing
 * piece is fetched once however many clients wait for it, stores pieces as they arrive, and
 * folds them in order into a running hash of the whole blob: only when that hash equals the
 * digest does the blob count as complete (and a streamed copy get its final bytes).
 */
export class BlobTask {
  readonly layout: PieceLayout;
  private readonly inflight = new Map<number, Deferred>();
  /**
   * Pieces on their way that only background readers asked for (a lazily mounted layer filling in
   * after its workload started): a seed fetching on demand puts them after its children's reads.
   */
  private readonly backgroundOnly = new Set<number>();
  private readonly verification = deferred();
  private readonly persisted = deferred();
  private hashedPieces = 0;
  /** The whole-blob digest, computed off the JavaScript thread where it can be. */
  private readonly hasher: StreamingHash;
  private hashing: Promise<void> = Promise.resolve();
  private failure?: Error;
  /**
   * Stored pieces whose bytes matched a digest the scheduler confirmed (a peer's whole blob
   * verified with it), whoever brought them.
   */
  private readonly verifiedPieces = new Set<number>();
  /**
   * Stored pieces from parents, checked against the digest an origin reader reported: the
   * swarm's one read of the registry, served to later requests naming that registry like a
   * verified piece, but dropped if any peer's copy of the blob fails its digest (docs/security.md).
   * Pieces this peer read from the origin itself are neither: they go to the request that
   * fetched them, and are kept aside until the blob verifies or their digest is confirmed.
   */
  private readonly vouchedPieces = new Set<number>();
  /** Piece digests the scheduler confirmed ("sha256:<hex>"), for pieces stored later. */
  private readonly confirmedDigests = new Map<number, string>();
  /** Pieces being written right now, so two sources delivering one piece write it once. */
  private readonly writing = new Set<number>();
  /** Clients reading the whole blob from its start: the swarm fetches the head first for them. */
  streamingReaders = 0;
  /**
   * The last pieces stored, kept in memory for the whole-blob hash and for clients streaming
   * the blob as it arrives, so neither has to read them back from disk.
   */
  private readonly recent = new Map<number, Buffer>();
  readonly bytesBySource: Record<PieceOrigin, number> = { origin: 0, peer: 0, seed: 0 };
  /** Pieces on their way, with the bytes that have arrived so far (one per fetch of the piece). */
  private readonly growing = new Map<number, Set<GrowingPiece>>();
  /** Bumped whenever a piece starts arriving, so followers of this task's bitmap hear of it. */
  private growingStarts = 0;
  /** Settled (and replaced) whenever a piece starts arriving. */
  private growthSignal = deferred();

  constructor(
    private readonly store: BlobStore,
    readonly blob: StoredBlob,
    private readonly log: Logger,
    private readonly events: TaskEvents,
    /** 'sha256' when piece digests are needed (a swarm peer reports them), else 'crc'. */
    private readonly pieceCheckKind: PieceCheckKind = 'sha256',
  ) {
    this.layout = blob.layout;
    this.hasher = createStreamingHash(parseDigest(blob.digest).algorithm);
    if (blob.complete) {
      this.hashedPieces = this.layout.pieceCount;
      this.verification.resolve();
      this.persisted.resolve();
    } else if (blob.storedPieceCount === this.layout.pieceCount) {
      // Every piece was stored before a restart cut the verification short: no piece will
      // arrive to start it again, so verify now (readers of the last bytes wait for it).
      this.foldIntoBlobHash();
    }
  }

  get digest(): string {
    return this.blob.digest;
  }
  get size(): number {
    return this.blob.size;
  }
  get complete(): boolean {
    return this.blob.complete;
  }
  get failed(): Error | undefined {
    return this.failure;
  }

  /** Resolves when the whole blob has been verified against its digest. */
  whenVerified(): Promise<void> {
    return this.verification.promise;
  }

  /** Resolves when the verified blob is also flushed to disk and recorded as complete. */
  whenPersisted(): Promise<void> {
    return this.persisted.promise;
  }

  /**
   * Starts fetching whatever of pieces [first, last] is neither stored nor already on its way,
   * and returns those pieces: the ones this caller's request brings.
   */
  request(first: number, last: number, source: PieceSource, priority: ReadPriority = 'demand'): Set<number> {
    const started = new Set<number>();
    if (this.failure) return started;
    for (let index = first; index <= last; index++) {
      if (priority === 'demand') this.backgroundOnly.delete(index);
      else if (!this.blob.hasPiece(index) && !this.inflight.has(index)) this.backgroundOnly.add(index);
    }
    let runStart = -1;
    const runs: PieceRun[] = [];
    for (let index = first; index <= last + 1; index++) {
      const missing = index <= last && !this.blob.hasPiece(index) && !this.inflight.has(index);
      if (missing && runStart < 0) runStart = index;
      if (!missing && runStart >= 0) {
        runs.push({ first: runStart, last: index - 1 });
        runStart = -1;
      }
    }
    for (const run of runs) {
      for (let index = run.first; index <= run.last; index++) {
        this.inflight.set(index, deferred());
        started.add(index);
      }
      void this.fetchRun(run, source);
    }
    return started;
  }

  /** Resolves once piece `index` is stored; rejects if fetching it failed. */
  async waitForPiece(index: number): Promise<void> {
    if (this.failure) throw this.failure;
    if (this.blob.hasPiece(index)) return;
    const pending = this.inflight.get(index);
    if (!pending) throw new Error(`piece ${index} of ${this.digest} was not requested`);
    await pending.promise;
  }

  hasPiece(index: number): boolean {
    return this.blob.hasPiece(index);
  }

  /** Only background readers wait for the piece: no workload is blocked on it. */
  wantedInBackgroundOnly(index: number): boolean {
    return this.backgroundOnly.has(index);
  }

  /**
   * Piece digests the scheduler confirmed: a stored piece matching one (whoever brought it) may
   * be served to any request, and so may one stored later.
   */
  confirmPieces(digests: Record<number, string>): void {
    for (const [key, digest] of Object.entries(digests)) {
      const index = Number(key);
      if (!Number.isInteger(index) || index < 0 || index >= this.layout.pieceCount) continue;
      this.confirmedDigests.set(index, digest);
      if (this.blob.pieceDigest(index) === digest) this.verifiedPieces.add(index);
    }
  }

  /** Whether some stored piece is only a registry's word: read from it, or checked against an origin reader's digest. */
  holdsUnverifiedPieces(): boolean {
    return !this.blob.complete && this.blob.storedPieceCount > this.verifiedPieces.size;
  }

  /**
   * A stored piece that may be served to any request naming the blob's registry: the blob is
   * verified, or the piece's digest was confirmed or vouched for by the swarm's origin reader.
   */
  pieceServable(index: number): boolean {
    return this.pieceVerified(index) || this.vouchedPieces.has(index);
  }

  /** A stored piece known to be the blob's: the blob is verified, or the piece's digest was confirmed. */
  pieceVerified(index: number): boolean {
    return this.blob.complete || this.verifiedPieces.has(index);
  }

  /**
   * Resolves once piece `index` (already requested) is stored or its bytes have begun to arrive:
   * the source has answered. Rejects if its fetch failed first, so a response not yet begun can
   * still say why with its status.
   */
  async waitForFirstBytes(index: number): Promise<void> {
    const stored = this.waitForPiece(index);
    stored.catch(() => undefined); // raced below only while nothing has arrived
    while (!this.blob.hasPiece(index) && !this.growing.has(index)) await Promise.race([stored, this.growthSignal.promise]);
  }

  /**
   * Registers a fetch of piece `index` whose bytes may be relayed while they arrive. The
   * caller fills the returned piece's buffer, calls `advance` as it goes and `end` when done
   * (after storing the piece: `end` lets go of the fetch's hold on the pooled buffer).
   */
  beginPiece(index: number, fromOrigin = false): GrowingPiece {
    const { length } = pieceBounds(this.layout, index);
    const piece = new GrowingPiece(
      index,
      pieceBuffers.take(length),
      (ended) => {
        const set = this.growing.get(index);
        set?.delete(ended);
        if (set?.size === 0) this.growing.delete(index);
        pieceBuffers.release(ended.buffer);
      },
      fromOrigin,
    );
    let set = this.growing.get(index);
    if (!set) this.growing.set(index, (set = new Set()));
    set.add(piece);
    this.growingStarts++;
    const signal = this.growthSignal;
    this.growthSignal = deferred();
    signal.resolve();
    this.events.pieceGrowing?.(this, index);
    return piece;
  }

  /** The fetch of piece `index` that has the most bytes so far, if one is under way (origin fetches only, if asked). */
  growingPiece(index: number, fromOriginOnly = false): GrowingPiece | undefined {
    let best: GrowingPiece | undefined;
    for (const piece of this.growing.get(index) ?? []) {
      if (fromOriginOnly && !piece.fromOrigin) continue;
      if (!best || piece.filled > best.filled) best = piece;
    }
    return best;
  }

  /**
   * Waits until a fetch of piece `index` from the origin holds more than `seen` bytes, and
   * returns it with its buffer held for the caller (see piece-buffers.ts: the caller releases
   * it); returns undefined once the piece is stored instead. Rejects as waitForPiece does.
   */
  async waitForOriginBytes(index: number, seen: number): Promise<GrowingPiece | undefined> {
    const stored = this.waitForPiece(index);
    stored.catch(() => undefined); // a failure after the bytes were handed out is the next caller's to see
    while (!this.blob.hasPiece(index)) {
      const growing = this.growingPiece(index, true);
      if (growing && growing.filled > seen) {
        pieceBuffers.hold(growing.buffer);
        return growing;
      }
      await Promise.race([stored, growing ? growing.next(seen) : this.growthSignal.promise]);
    }
    return undefined;
  }

  /**
   * Piece `index` is stored, its bytes are arriving, or it was requested for a reader that waits
   * for it. A piece requested only for background readers does not count: the swarm may hold it
   * until the nodes still starting have read what they need (policy/background-put-off.ts), and a
   * workload's read inside it would wait as long (8 nodes end to end: 5-8 s for the last two).
   */
  holdsOrFetchesOnDemand(index: number): boolean {
    if (this.blob.hasPiece(index) || this.growing.has(index)) return true;
    return this.inflight.has(index) && !this.backgroundOnly.has(index);
  }

  isGrowing(index: number): boolean {
    return !this.blob.hasPiece(index) && this.growing.has(index);
  }

  /** Changes whenever a piece is stored or starts arriving (what a bitmap follower waits for). */
  get availabilityVersion(): number {
    return this.blob.storedPieceCount + this.growingStarts;
  }

  /** Missing pieces of a run, as contiguous runs. */
  private missingRuns(run: PieceRun): PieceRun[] {
    const runs: PieceRun[] = [];
    let start = -1;
    for (let index = run.first; index <= run.last + 1; index++) {
      const missing = index <= run.last && !this.blob.hasPiece(index);
      if (missing && start < 0) start = index;
      if (!missing && start >= 0) {
        runs.push({ first: start, last: index - 1 });
        start = -1;
      }
    }
    return runs;
  }

  private async fetchRun(run: PieceRun, source: PieceSource): Promise<void> {
    let attempt = 0;
    let pending = [run];
    const inRun = (index: number) => index >= run.first && index <= run.last;
    while (pending.length) {
      try {
        for (const part of pending) {
          await source.fetchRun(
            this.layout,
            part,
            async (index, bytes, provenance) => {
              // A piece outside our run that another fetch is bringing is left to that fetch.
              if (!inRun(index) && this.inflight.has(index)) return;
              await this.storePiece(index, bytes, { from: source.kind, ...provenance });
            },
            undefined,
            (index) => this.beginPiece(index, source.kind === 'origin'),
          );
        }
        pending = this.missingRuns(run);
        if (pending.length) throw new Error(`${source.description} did not deliver every piece it was asked for`);
      } catch (error) {
        const err = error as Error;
        if (err instanceof BlobSizeMismatchError) return void this.fail(err).catch(() => undefined);
        // The origin's own refusal (401, 404...) is final; a broken connection is worth a retry.
        const retryable = !(err instanceof UpstreamStatusError) && !(err instanceof BlobDigestMismatchError);
        pending = this.missingRuns(run);
        if (!pending.length) return;
        if (retryable && ++attempt <= RETRIES_PER_RUN && !this.failure) {
          this.log.warn({ digest: this.digest, source: source.description, attempt, err: err.message }, 'piece run failed; retrying');
          continue;
        }
        for (const part of pending) for (let index = part.first; index <= part.last; index++) this.settle(index, err);
        return;
      }
    }
  }

  /**
   * Stores one piece that arrived from any source, unless it is already stored or being written.
   * Callers that fetched from peers have already checked the bytes against a trusted digest.
   */
  async storePiece(index: number, bytes: Buffer, provenance: PieceProvenance): Promise<void> {
    if (this.failure) throw this.failure;
    if (this.blob.hasPiece(index) || this.writing.has(index)) return;
    const expected = pieceBounds(this.layout, index).length;
    if (bytes.length !== expected) throw new Error(`piece ${index} has ${bytes.length} bytes, expected ${expected}`);
    this.writing.add(index);
    try {
      // A digest vouched for by the scheduler is the check; else the cheapest this peer may keep.
      const check = provenance.sha256 ?? (await pieceCheck(this.pieceCheckKind, bytes));
      await this.store.writePiece(this.blob, index, bytes, check);
      const sha256 = checkSha256(check);
      if (sha256 && this.confirmedDigests.get(index) === `sha256:${sha256}`) this.verifiedPieces.add(index);
      else if (provenance.from !== 'origin' && provenance.sha256) this.vouchedPieces.add(index);
      this.bytesBySource[provenance.from] += bytes.length;
      this.events.pieceStored(this, index, bytes.length, { ...provenance, sha256 });
    } finally {
      this.writing.delete(index);
    }
    this.remember(index, bytes);
    this.settle(index);
    this.foldIntoBlobHash();
  }

  /** A stored piece's bytes if they are still in memory (hold them before any await: piece-buffers.ts). */
  recentPiece(index: number): Buffer | undefined {
    return this.recent.get(index);
  }

  private remember(index: number, bytes: Buffer): void {
    if (this.recent.has(index)) return;
    pieceBuffers.hold(bytes);
    this.recent.set(index, bytes);
    let held = 0;
    for (const buffer of this.recent.values()) held += buffer.length;
    // Drop the oldest pieces first, sparing those the running hash has yet to consume unless
    // too many are waiting (a gap in the prefix): those are read back from disk instead.
    for (const [oldest, buffer] of [...this.recent]) {
      if (held <= RECENT_BYTES) break;
      if (oldest >= this.hashedPieces && this.recent.size <= RECENT_PIECES_MAX) continue;
      this.recent.delete(oldest);
      pieceBuffers.release(buffer);
      held -= buffer.length;
    }
  }

  /** Lets go of in-memory pieces once nobody streams the blob as it arrives. */
  releaseMemory(): void {
    if (this.streamingReaders === 0 && this.blob.complete) this.forgetRecent();
  }

  private forgetRecent(): void {
    for (const buffer of this.recent.values()) pieceBuffers.release(buffer);
    this.recent.clear();
  }

  /** Marks pieces as expected from a fetch the caller runs itself (the swarm), so waiters can wait. */
  expect(indexes: Iterable<number>): void {
    for (const index of indexes) if (!this.blob.hasPiece(index) && !this.inflight.has(index)) this.inflight.set(index, deferred());
  }

  /** Fails the waiters of pieces a caller-run fetch gave up on. */
  abandon(indexes: Iterable<number>, error: Error): void {
    for (const index of indexes) if (!this.blob.hasPiece(index)) this.settle(index, error);
  }

  private settle(index: number, error?: Error): void {
    const pending = this.inflight.get(index);
    if (!pending) return;
    this.inflight.delete(index);
    this.backgroundOnly.delete(index);
    if (error) pending.reject(error);
    else pending.resolve();
  }

  /**
   * Advances the whole-blob hash over the stored prefix, in order, one pass at a time. A pass
   * that throws fails the blob: left rejected, the chain would skip every later pass, and the
   * blob would neither complete nor fail while its readers wait.
   */
  private foldIntoBlobHash(): void {
    this.hashing = this.hashing
      .then(() => this.advanceBlobHash())
      .catch((error: Error) =>
        this.fail(
          error instanceof BlobHashError
            ? error
            : new BlobHashError(`could not hash blob ${this.digest} at piece ${this.hashedPieces}: ${error.message}`),
        ),
      )
      .catch((error: Error) => this.log.error({ digest: this.digest, err: error.message }, 'could not discard a blob whose hash failed'));
  }

  private async advanceBlobHash(): Promise<void> {
    while (!this.failure && this.hashedPieces < this.layout.pieceCount && this.blob.hasPiece(this.hashedPieces)) {
      const index = this.hashedPieces;
      const inMemory = this.recent.get(index);
      if (inMemory) {
        pieceBuffers.hold(inMemory);
        await this.hasher.update(inMemory).finally(() => pieceBuffers.release(inMemory));
      } else {
        const { offset, length } = pieceBounds(this.layout, index);
        const buffer = pieceBuffers.take(length);
        try {
          // A pooled buffer holds an earlier piece's bytes: a short read must not hash them.
          const read = await this.blob.read(buffer, offset, length);
          if (read !== length) throw new BlobHashError(`piece ${index} of ${this.digest} reads back ${read} of its ${length} bytes`);
          await this.hasher.update(buffer);
        } finally {
          pieceBuffers.release(buffer);
        }
      }
      this.hashedPieces++;
    }
    if (this.hashedPieces === this.layout.pieceCount && !this.blob.complete && !this.failure) await this.finishVerification();
  }

  private async finishVerification(): Promise<void> {
    const actual = `${parseDigest(this.blob.digest).algorithm}:${this.hasher.hex()}`;
    if (actual !== this.blob.digest) {
      const error = new BlobDigestMismatchError(`blob content does not match its digest ${this.blob.digest} (got ${actual})`);
      await this.fail(error);
      return;
    }
    // Clients may have their last bytes now: they are verified. The complete flag follows the fsync.
    this.verification.resolve();
    try {
      await this.blob.markComplete();
    } catch (error) {
      // Not recorded as complete: after a restart its pieces are checked again and it is finished then.
      this.log.warn({ digest: this.digest, err: (error as Error).message }, 'could not record the blob as complete');
      this.persisted.reject(error as Error);
      return;
    }
    this.persisted.resolve();
    this.releaseMemory();
    this.events.verified(this);
  }

  /** Drops everything stored for this blob and fails every waiter. */
  async fail(error: Error): Promise<void> {
    if (this.failure) return;
    this.failure = error;
    this.log.error({ digest: this.digest, err: error.message }, 'blob failed verification; discarding it');
    this.verification.reject(error);
    this.persisted.reject(error);
    for (const index of [...this.inflight.keys()]) this.settle(index, error);
    this.forgetRecent();
    await this.store.remove(this.digest);
    this.events.failed(this, error);
  }
}
