import { sha256Hex } from '../../common/hashing.js';
import type { Logger } from '../../common/log.js';
import type { PeerPacket, PieceDigests } from '../../rpc/scheduler-api.js';
import { pieceBounds } from '../../storage/piece-plan.js';
import type { BlobTask } from '../blob-task.js';
import type { GrowingPiece } from '../growing-piece.js';
import { ParentBusyError, PieceCutShortError, PieceDeferredError, PieceMissingError, type ParentLink } from './parent-link.js';
import type { ParentSet } from './parent-set.js';
import { orderCandidates, pieceTieBreaks, type Candidate } from './policy/candidate-order.js';
import { waitsForSwarm } from './policy/background-put-off.js';
import { chainParentsServe, dropsWithRetiredParent, wantsSecondParent } from './policy/endgame.js';
import { bestParentFor, stillUploading, type ParentChoice } from './policy/parent-choice.js';
import { pieceCheckIntervalMs, RETRY_AFTER_FAILED_PIECE_MS } from './policy/stall.js';
import type { WantedPieces } from './wanted-pieces.js';

export interface ParentFetchSettings {
  /** Pieces fetched from parents at once for one task. */
  parallelism: number;
  /** Pieces fetched from one parent at once. */
  perParent: number;
  /** A piece from a parent that sends no byte of it for this long is given up and fetched elsewhere. */
  pieceTimeoutMs: number;
}

export interface ParentFetchEvents {
  /** Says something to the scheduler (a piece begun, a piece failed). */
  report(packet: PeerPacket): void;
  /** Opens a piece's relay buffer as its bytes start to arrive from parent `parentId`. */
  beginPiece(index: number, parentId: string): GrowingPiece;
  /** An attempt at piece `index` ended, whatever came of it. */
  settled(index: number): void;
  /** A seed put a background piece off: the download is waiting on purpose, not stalled. */
  putOff(): void;
}

/**
 * How long a piece from a parent that fetched it on demand waits for its digest. The seed reports
 * the digest to the scheduler as it stores the piece, the moment it sends the piece's last byte;
 * the scheduler passes it on within milliseconds. A digest that never comes (the report lost with
 * a scheduler) fails the attempt, softly: the piece is asked for again.
 */
const DIGEST_WAIT_MS = 10_000;

/**
 * After a seed put a background piece off, how long background pieces are not asked of it again.
 * The seed serves them once no child has asked it for a piece a workload waits for in a while
 * (policy/background-put-off.ts): a retry every half second costs one small request.
 */
const BACKGROUND_RETRY_MS = 500;

/** A piece fetched on demand arrived, and no digest to check it against came in DIGEST_WAIT_MS. */
class DigestNotVouchedError extends Error {
  override name = 'DigestNotVouchedError';
}

interface Attempt {
  link: ParentLink;
  controller: AbortController;
  started: number;
  /** The piece's length in bytes. */
  length: number;
  /** The piece's bytes as they arrive, once the parent has begun to send them (relayed to this peer's children as they come). */
  growing?: GrowingPiece;
  /** When the parent agreed to send it. */
  firstByteAt?: number;
}

/**
 * Fetches a task's wanted pieces from its parents, as the policy orders them (policy/): each
 * piece from one parent, a straggler at the tail from a second one, every piece checked against
 * the digest the scheduler vouched for before it is stored. Pieces go one way: parent → check →
 * task; what the task does with a stored piece does not come back here.
 */
export class PiecesFromParents {
  private readonly attempts = new Map<number, Attempt[]>();
  /** Piece digests the scheduler vouched for (from the peer that read the origin). */
  private readonly digests = new Map<number, string>();
  /** The digests among them that a verified whole blob confirmed. */
  private readonly confirmed = new Set<number>();
  /** Checks waiting for a piece's digest (a piece a parent fetched on demand, vouched for as it was stored there). */
  private readonly digestWaiters = new Map<number, Set<() => void>>();
  /**
   * Whether pieces not vouched for yet may be asked of a parent that fetches them on demand: not
   * while no scheduler is there to vouch for them, nor after a digest failed to come, until the
   * next one does. Else the attempts would keep the peer from ever falling back to the origin.
   */
  private unvouchedAllowed = true;
  /** Until then, pieces only background readers want are not asked of a seed that put one off. */
  private backgroundPutOffUntil = 0;
  /** Since when the scheduler says the registry's swarm reads on demand (policy waitsForSwarm); undefined: it does not. */
  private readingSince?: number;
  private schedulerLost = false;
  /** The fastest a parent has served this peer (ParentPace.rate, bytes per millisecond): what the endgame expects of one not measured yet. */
  private fastestServed = 0;
  /** A random rank per piece, fixed for this download (pieceTieBreaks). */
  private readonly tieBreak: Float64Array;
  private running = false;
  private stopped = false;
  /** The pump due when a busy parent's wait ends (pumpWhenBackoffEnds). */
  private backoffWake?: { at: number; timer: NodeJS.Timeout };

  constructor(
    private readonly task: BlobTask,
    private readonly wanted: WantedPieces,
    private readonly parents: ParentSet,
    private readonly settings: ParentFetchSettings,
    private readonly events: ParentFetchEvents,
    private readonly log: Logger,
  ) {
    this.tieBreak = pieceTieBreaks(task.layout.pieceCount);
  }

  /** The scheduler says whether the registry's swarm reads on demand (SwarmReading); a repeated "yes" keeps the first time. */
  swarmReading(onDemand: boolean): void {
    this.readingSince = onDemand ? (this.readingSince ?? Date.now()) : undefined;
  }

  /** Since when the scheduler says the registry's swarm reads on demand, or undefined. */
  get swarmReadingSince(): number | undefined {
    return this.readingSince;
  }

  /** Every wanted piece waits on purpose: only background readers want it, and the swarm reads on demand. */
  waitsForSwarmOnly(now: number): boolean {
    if (!waitsForSwarm(this.readingSince, now)) return false;
    for (const index of this.wanted) if (!this.task.wantedInBackgroundOnly(index)) return false;
    return true;
  }

  /** Pieces on their way from parents. */
  get onTheirWay(): number {
    return this.attempts.size;
  }

  isOnItsWay(index: number): boolean {
    return this.attempts.has(index);
  }

  /** Whether every piece the task lacks has a vouched digest, so parents alone can bring the rest. */
  canCheckEveryMissingPiece(): boolean {
    for (let index = 0; index < this.task.layout.pieceCount; index++) {
      if (!this.task.hasPiece(index) && !this.digests.has(index)) return false;
    }
    return true;
  }

  /** Takes the scheduler's digests (scheduler-api.ts, PieceDigests). */
  vouch({ digests, confirmed = false, forgetVouched = false }: PieceDigests): void {
    this.unvouchedAllowed = true;
    if (forgetVouched) {
      for (const index of this.digests.keys()) if (!this.confirmed.has(index)) this.digests.delete(index);
    }
    for (const [key, digest] of Object.entries(digests ?? {})) {
      const index = Number(key);
      // A confirmed digest is the piece's true one: no later word of an origin reader replaces it.
      if (this.confirmed.has(index)) continue;
      if (confirmed) this.confirmed.add(index);
      this.digests.set(index, digest);
      const waiters = this.digestWaiters.get(index);
      this.digestWaiters.delete(index);
      for (const wake of waiters ?? []) wake();
    }
  }

  /** The piece's vouched digest, waiting up to DIGEST_WAIT_MS for it (or until the attempt is aborted). */
  private async vouchedDigest(index: number, signal: AbortSignal): Promise<string> {
    const known = this.digests.get(index);
    if (known) return known;
    await new Promise<void>((resolve) => {
      const waiters = this.digestWaiters.get(index) ?? new Set<() => void>();
      this.digestWaiters.set(index, waiters);
      const done = () => {
        clearTimeout(timer);
        signal.removeEventListener('abort', done);
        waiters.delete(done);
        resolve();
      };
      const timer = setTimeout(done, DIGEST_WAIT_MS);
      signal.addEventListener('abort', done);
      waiters.add(done);
    });
    const digest = this.digests.get(index);
    if (!digest) throw new DigestNotVouchedError(`no digest vouched for piece ${index} within ${DIGEST_WAIT_MS} ms of its bytes`);
    return digest;
  }

  /** Every scheduler was lost (or one is back): no digest can be vouched for meanwhile. */
  schedulerGone(gone: boolean): void {
    this.schedulerLost = gone;
  }

  /** Starts fetching (the scheduler named parents or said wait); stop() ends it for good. */
  run(): void {
    if (!this.stopped) this.running = true;
  }

  /** No new attempts (the download reads the origin now); pieces on their way still arrive. */
  pause(): void {
    this.running = false;
  }

  /** No new attempts, and those on their way are aborted (the download left the task). */
  stop(): void {
    this.running = false;
    this.stopped = true;
    if (this.backoffWake) clearTimeout(this.backoffWake.timer);
    for (const attempts of this.attempts.values()) for (const attempt of attempts) attempt.controller.abort();
  }

  /**
   * Pieces on their way from parents the scheduler replaced (their links are retired, not
   * dropped): one that arrives far slower than expected of a parent (policy
   * dropsWithRetiredParent) is given up, and its relays to this peer's children end with it, so
   * that they and it ask the piece of the new parents. The others finish. Asked when parents are
   * replaced and at every watchdog round. Returns the pieces given up.
   */
  retiredStragglers(): number[] {
    const now = Date.now();
    const given: number[] = [];
    for (const [index, attempts] of this.attempts) {
      for (const attempt of attempts) {
        if (!attempt.link.closed || attempt.controller.signal.aborted) continue;
        const progress = { receivedBytes: attempt.growing?.filled ?? 0, elapsedMs: now - attempt.started, length: attempt.length };
        if (!dropsWithRetiredParent(progress, attempt.link.rate, chainParentsServe(this.parents, index))) continue;
        attempt.controller.abort();
        given.push(index);
      }
    }
    return given;
  }

  /** Fills the free fetch slots with the best pieces from the best parents; at the tail, the endgame. */
  pump(): void {
    if (!this.running || this.wanted.failed) return;
    let budget = this.settings.parallelism - this.attempts.size;
    const order = this.candidateOrder();
    const whole = this.wantsWholeBlob();
    const choice = this.parentChoice();
    for (const index of order) {
      if (budget <= 0) break;
      const link = bestParentFor(index, this.askable(index, choice.now, whole), choice);
      if (!link) continue;
      this.startAttempt(index, link, whole);
      budget--;
    }
    if (budget > 0 && order.length > 0) this.pumpWhenBackoffEnds(choice.now);
    if (order.length === 0 && this.attempts.size > 0) this.endgame();
  }

  /**
   * Pieces wait while a parent that answered 429 is left alone: pump again when its wait ends.
   * Nothing else need come then (a parent that holds the whole blob sends no more bitmap news), and
   * a download whose only parent had been busy sat idle until the watchdog (simulated, a node at
   * 97 Gbit/s idle for 0.83 s under a parent that had finished).
   */
  private pumpWhenBackoffEnds(now: number): void {
    let until = Infinity;
    for (const link of this.parents) if (!link.closed && link.busyUntil > now) until = Math.min(until, link.busyUntil);
    if (until === Infinity || (this.backoffWake && this.backoffWake.at <= until)) return;
    if (this.backoffWake) clearTimeout(this.backoffWake.timer);
    const timer = setTimeout(() => {
      this.backoffWake = undefined;
      this.pump();
    }, until - now);
    timer.unref();
    this.backoffWake = { at: until, timer };
  }

  /**
   * Wanted pieces that can be fetched now, best first (policy/candidate-order.ts). A piece still
   * arriving at a parent counts: the parent relays it as it comes. Only pieces whose digest the
   * scheduler has vouched for are asked for, or that a parent fetches on demand (a seed: it reads
   * the origin for the piece, and the scheduler vouches for the digest it reports as it stores
   * it): a digest that never comes otherwise (its report lost with a scheduler) would keep
   * attempts waiting, and a peer with attempts on their way never falls back to the origin.
   */
  private candidateOrder(): number[] {
    const available: Candidate[] = [];
    const now = Date.now();
    const whole = this.wantsWholeBlob();
    for (const index of this.wanted) {
      if (this.task.hasPiece(index) || this.attempts.has(index)) continue;
      let holders = 0;
      let nodeHolders = 0;
      let carried = false;
      for (const link of this.parents) {
        if (!this.mayAsk(link, index, now, whole)) continue;
        holders++;
        if (!link.seed) nodeHolders++;
        carried ||= link.carries(index);
      }
      const awaited = !whole && !this.task.wantedInBackgroundOnly(index);
      if (holders > 0) available.push({ index, holders, nodeHolders, awaited, carried });
    }
    return orderCandidates(available, (index) => this.tieBreak[index] ?? 0, this.task.streamingReaders > 0);
  }

  /**
   * Whether piece `index` may be asked of `link` now: the link offers it, and either its digest is
   * vouched for or the link fetches it on demand while a scheduler can vouch for it. A piece only
   * background readers want waits while the swarm reads on demand, and after a seed put it off,
   * for that seed (or a parent that has it).
   */
  private mayAsk(link: ParentLink, index: number, now: number, wholeBlob: boolean): boolean {
    if (!link.offers(index)) return false;
    // A parent other than a seed fetches a piece it lacks for a lazy reader only: a whole download
    // asks each parent for what it holds or receives, and the parent graph brings the rest.
    if (wholeBlob && !link.seed && !link.carries(index)) return false;
    const vouched = this.digests.has(index);
    if (!vouched && !(link.onDemand && this.unvouchedAllowed && !this.schedulerLost)) return false;
    const backgroundOnly = this.task.wantedInBackgroundOnly(index);
    // While other nodes start, their reads have the links: not even a parent holding the piece is asked.
    if (backgroundOnly && waitsForSwarm(this.readingSince, now)) return false;
    const putOff = now < this.backgroundPutOffUntil && backgroundOnly;
    return !putOff || link.carries(index);
  }

  /**
   * The parents piece `index` may be asked of now, best kind first: those that hold or receive it,
   * else seeds that fetch it from the origin, else peers that fetch it through their own parents.
   */
  private askable(index: number, now: number, wholeBlob: boolean): ParentLink[] {
    const may = [...this.parents].filter((link) => this.mayAsk(link, index, now, wholeBlob));
    const carriers = may.filter((link) => link.carries(index));
    if (carriers.length) return carriers;
    const seeds = may.filter((link) => link.seed);
    return seeds.length ? seeds : may;
  }

  /**
   * Every piece not held is wanted by a reader that waits for it: a download of the whole blob. A
   * lazy reader wants a few; its background fetch may want the rest of a small layer at once, but
   * is no whole download (a seed reading the rest of the blob for it would fill the registry's
   * link while other nodes start: 3.26 copies of the bytes they needed, 8 nodes end to end).
   */
  private wantsWholeBlob(): boolean {
    const missing = this.task.layout.pieceCount - this.task.blob.storedPieceCount;
    if (this.wanted.size < missing) return false;
    let waitedFor = 0;
    for (const index of this.wanted) if (!this.task.wantedInBackgroundOnly(index)) waitedFor++;
    return waitedFor >= missing;
  }

  private parentChoice(): ParentChoice<ParentLink> {
    return {
      now: Date.now(),
      perParent: this.settings.perParent,
      hasNodeParents: this.parents.hasNodeParents,
      uploading: (link) => this.uploadsFrom(link),
    };
  }

  /** Pieces `link` is still sending to this peer (policy stillUploading: not one whose last byte alone is held back). */
  private uploadsFrom(link: ParentLink): number {
    let count = 0;
    for (const attempts of this.attempts.values()) {
      for (const attempt of attempts) if (attempt.link === link && stillUploading(attempt.growing?.filled, attempt.length)) count++;
    }
    return count;
  }

  /**
   * At the tail (every wanted piece stored or on its way), a straggling piece is asked of a
   * second parent too; the first answer wins.
   */
  private endgame(): void {
    for (const index of this.wanted) if (!this.attempts.has(index)) return;
    const now = Date.now();
    const choice = this.parentChoice();
    const whole = this.wantsWholeBlob();
    for (const [index, attempts] of this.attempts) {
      // A piece just stored is still listed until its attempt settles: it needs no second parent.
      const first = attempts[0];
      if (!first || attempts.length !== 1 || this.task.hasPiece(index)) continue;
      const link = bestParentFor(index, this.askable(index, now, whole), choice, first.link);
      if (!link) continue;
      const progress = { receivedBytes: first.growing?.filled ?? 0, elapsedMs: now - first.started };
      if (wantsSecondParent(progress, link.rate, this.fastestServed)) this.startAttempt(index, link, whole);
    }
  }

  private startAttempt(index: number, link: ParentLink, wholeBlob: boolean): void {
    const { length } = pieceBounds(this.task.layout, index);
    const attempt: Attempt = { link, controller: new AbortController(), started: Date.now(), length };
    const list = this.attempts.get(index) ?? [];
    list.push(attempt);
    this.attempts.set(index, list);
    link.attemptStarted();
    // Which piece a peer asks of which parent, and whether the parent had it on its way, is what
    // decides whether a chain relays as it receives: logged at debug to read a cluster run's logs.
    if (this.log.isLevelEnabled('debug'))
      this.log.debug(
        {
          task: this.task.digest,
          index,
          parent: link.id,
          carried: link.carries(index),
          background: this.task.wantedInBackgroundOnly(index),
        },
        'piece asked',
      );
    const stall = this.watchForStall(attempt);
    let stored = false;
    let failure: string | undefined;
    void link
      .fetchPiece(index, () => this.beginPiece(index, attempt), attempt.controller.signal, {
        wholeBlob,
        background: this.task.wantedInBackgroundOnly(index),
      })
      .then(async (bytes) => {
        stored = await this.checkAndStore(index, attempt, bytes);
        if (stored) this.fastestServed = Math.max(this.fastestServed, link.rate);
      })
      .catch((error: Error) => {
        failure = error.name;
        this.failed(index, attempt, error, stall.timedOut);
      })
      .finally(() => {
        if (this.log.isLevelEnabled('debug'))
          this.log.debug(
            {
              task: this.task.digest,
              index,
              parent: link.id,
              stored,
              failure,
              ms: Date.now() - attempt.started,
              firstByteMs: attempt.firstByteAt && attempt.firstByteAt - attempt.started,
            },
            'piece attempt ended',
          );
        stall.stop();
        attempt.growing?.end();
        link.attemptEnded();
        const remaining = (this.attempts.get(index) ?? []).filter((a) => a !== attempt);
        if (remaining.length) this.attempts.set(index, remaining);
        else this.attempts.delete(index);
        this.events.settled(index);
        // The next piece at once after a good one: in a pipeline the child's only parent is free
        // again only now, and every millisecond idle here is lost by every peer down the chain.
        // A busy or failing parent is asked again a little later rather than at once.
        if (stored) this.pump();
        else setTimeout(() => this.pump(), RETRY_AFTER_FAILED_PIECE_MS).unref();
      });
  }

  /** The piece's relay buffer, once the parent has agreed to send it. */
  private beginPiece(index: number, attempt: Attempt): GrowingPiece {
    const growing = this.events.beginPiece(index, attempt.link.id);
    attempt.growing = growing;
    attempt.firstByteAt = Date.now();
    // All but the byte a relaying parent holds back until its own check: its upload to us is
    // over, and the next piece may be asked of it while this one is checked and stored.
    void growing.next(attempt.length - 2).then(() => {
      if (!attempt.controller.signal.aborted) this.pump();
    });
    return growing;
  }

  /** A stall, not a slow piece, is given up (policy/stall.ts): the attempt is aborted when no byte came for pieceTimeoutMs. */
  private watchForStall(attempt: Attempt): { readonly timedOut: boolean; stop(): void } {
    let seen = -1;
    let lastMoved = Date.now();
    const state = { timedOut: false, stop: () => clearInterval(timer) };
    const timer = setInterval(() => {
      const filled = attempt.growing?.filled ?? -1;
      if (filled !== seen) {
        seen = filled;
        lastMoved = Date.now();
      } else if (Date.now() - lastMoved >= this.settings.pieceTimeoutMs) {
        state.timedOut = true;
        attempt.controller.abort();
      }
    }, pieceCheckIntervalMs(this.settings.pieceTimeoutMs));
    return state;
  }

  /** Stores the piece if it matches its vouched digest (the other attempts at it are aborted); a mismatch drops the parent. */
  private async checkAndStore(index: number, attempt: Attempt, bytes: Buffer): Promise<boolean> {
    const { link } = attempt;
    const [sha256, vouched] = await Promise.all([sha256Hex(bytes), this.vouchedDigest(index, attempt.controller.signal)]);
    if (attempt.controller.signal.aborted) return false; // another parent's copy won meanwhile
    if (`sha256:${sha256}` !== vouched) {
      this.parents.drop(link, 'FAILURE_REASON_BAD_PIECE', `piece ${index} does not match its digest`, index);
      return false;
    }
    for (const other of this.attempts.get(index) ?? []) if (other !== attempt) other.controller.abort();
    await this.task.storePiece(index, bytes, {
      from: link.seed ? 'seed' : 'peer',
      parentId: link.id,
      sha256,
      costMs: Date.now() - attempt.started,
    });
    return true;
  }

  private failed(index: number, attempt: Attempt, error: Error, timedOut: boolean): void {
    const { link } = attempt;
    if (timedOut) {
      const message = `no byte of the piece for ${this.settings.pieceTimeoutMs} ms`;
      this.events.report({
        packet: 'pieceFailed',
        pieceFailed: { index, parentId: link.id, reason: 'FAILURE_REASON_PARENT_SLOW', message },
      });
    } else if (error instanceof PieceDeferredError) {
      // Not a stall: the seed is there, and serves the piece once its children's reads quieten.
      this.backgroundPutOffUntil = Date.now() + BACKGROUND_RETRY_MS;
      this.events.putOff();
    } else if (error instanceof DigestNotVouchedError) {
      this.unvouchedAllowed = false; // until the next digest comes
    } else if (attempt.controller.signal.aborted || error instanceof ParentBusyError || error instanceof PieceCutShortError) {
      // Lost the endgame race, the parent is busy, or a piece it relayed was given up
      // upstream: another parent or a later pump will do.
    } else if (error instanceof PieceMissingError) {
      this.events.report({
        packet: 'pieceFailed',
        pieceFailed: { index, parentId: link.id, reason: 'FAILURE_REASON_PIECE_MISSING', message: error.message },
      });
    } else if (link.pieceFailed()) {
      this.parents.drop(link, 'FAILURE_REASON_PARENT_UNREACHABLE', error.message, index);
    }
  }
}
