import type { Dispatcher } from 'undici';
import { sha256Hex } from '../../common/hashing.js';
import type { Logger } from '../../common/log.js';
import { blobUrl } from '../../oci/blob-url.js';
import type { FailureReason, OriginRequest, ParentInfo, PeerPacket, SchedulerPacket } from '../../rpc/scheduler-api.js';
import { CLIENT_AUTHORIZATION_HEADER, CLIENT_ORIGIN_HEADER } from '../../rpc/upload-api.js';
import type { ClientTls } from '../../common/tls.js';
import { pieceBounds } from '../../storage/piece-plan.js';
import type { BlobTask } from '../blob-task.js';
import type { GrowingPiece } from '../growing-piece.js';
import type { OriginSource } from '../sources/origin-source.js';
import { BlobSizeMismatchError, type PieceProvenance, type PieceRun } from '../sources/piece-source.js';
import { ParentBusyError, ParentLink, PieceCutShortError, PieceMissingError } from './parent-link.js';
import { orderCandidates, pieceTieBreaks, type Candidate } from './policy/candidate-order.js';
import { wantsSecondParent } from './policy/endgame.js';
import { originRuns } from './policy/origin-runs.js';
import { bestParentFor, stillUploading, type ParentChoice } from './policy/parent-choice.js';
import { pieceCheckIntervalMs, RETRY_AFTER_FAILED_PIECE_MS, stallVerdict, WATCHDOG_INTERVAL_MS } from './policy/stall.js';
import type { PeerStream, SchedulerClient } from './scheduler-client.js';

export interface SwarmSettings {
  hostId: string;
  clusterToken: string;
  /** How to reach other peers' upload servers over TLS, when the cluster uses it. */
  tls?: ClientTls;
  /** Pieces fetched from parents at once for one task. */
  parallelism: number;
  /** Pieces fetched from one parent at once. */
  perParent: number;
  /** A piece from a parent that sends no byte of it for this long is given up and fetched elsewhere. */
  pieceTimeoutMs: number;
  /** With nothing stored for this long, ask for new parents; ORIGIN_AFTER_STALLS times as long, go to the origin (policy/stall.ts). */
  stallMs: number;
  /** Told whenever a parent is dropped (for the peer's metrics). */
  onParentDropped?: (reason: FailureReason) => void;
}

type Mode = 'connecting' | 'swarm' | 'origin';

/**
 * Wanting nothing for this long, a peer gives its parents back (the scheduler's `idle`). Not at
 * once: a lazy reader's next request often follows within milliseconds, and holding a parent's
 * slot half a second longer costs little.
 */
const IDLE_AFTER_MS = 500;

interface Attempt {
  link: ParentLink;
  controller: AbortController;
  started: number;
  /** The piece's length in bytes. */
  length: number;
  /** The piece's bytes as they arrive, once the parent has begun to send them (relayed to this peer's children as they come). */
  growing?: GrowingPiece;
}

/**
 * One task's download through the swarm. It holds the scheduler stream for the task, follows
 * the parents the scheduler names, fetches wanted pieces from them (rarest first, or the head
 * first while a client streams the blob, with an endgame at the tail), checks every piece
 * against the digest the scheduler vouches for, and falls back to the origin when told to or
 * when the swarm fails it. After completion it stays registered as a holder for others.
 */
export class SwarmDownload {
  private mode: Mode = 'connecting';
  private stream?: PeerStream;
  private schedulerAddress?: string;
  private readonly digests = new Map<number, string>();
  private readonly links = new Map<string, ParentLink>();
  private readonly blocked = new Set<string>();
  private readonly wanted = new Set<number>();
  private readonly attempts = new Map<number, Attempt[]>();
  private readonly originBusy = new Set<number>();
  private readonly runWaiters: Array<{ run: PieceRun; resolve: () => void; reject: (error: Error) => void }> = [];
  private readonly unsent: PeerPacket[] = [];
  private origin?: OriginSource;
  private lastProgress = Date.now();
  private watchdog?: NodeJS.Timeout;
  private finished = false;
  private closed = false;
  private failure?: Error;
  private originAttempts = 0;
  /** Told the scheduler it wants nothing (so it holds no parents), and has not asked again since. */
  private idleReported = false;
  private idleTimer?: NodeJS.Timeout;
  /** A random rank per piece, fixed for this download (pieceTieBreaks). */
  private readonly tieBreak: Float64Array;

  constructor(
    readonly task: BlobTask,
    private readonly schedulers: SchedulerClient,
    private readonly dispatcher: Dispatcher,
    private readonly settings: SwarmSettings,
    private readonly log: Logger,
    private readonly onClosed: (download: SwarmDownload) => void,
  ) {
    this.tieBreak = pieceTieBreaks(task.layout.pieceCount);
  }

  get peerId(): string {
    return `${this.settings.hostId}|${this.task.digest}`;
  }

  /** Adds pieces to fetch; `origin` is how this caller would read the origin (its credentials). */
  want(run: PieceRun, origin: OriginSource): void {
    if (this.failure) return;
    this.origin ??= origin;
    const wasIdle = this.wanted.size === 0;
    let added = false;
    for (let index = run.first; index <= run.last; index++) {
      if (!this.task.hasPiece(index) && !this.wanted.has(index)) {
        this.wanted.add(index);
        added = true;
      }
    }
    if (added && wasIdle) this.lastProgress = Date.now();
    if (added && this.idleReported) {
      // Parents again, now: the scheduler gave them to others while this peer wanted nothing.
      this.idleReported = false;
      this.report({ packet: 'reschedule', reschedule: { blocklist: [...this.blocked] } });
    }
    if (this.mode === 'connecting' && !this.connectStarted) this.connect();
    if (this.mode === 'origin') this.fetchFromOrigin();
    else this.pump();
  }

  /** Resolves once every piece of the run is stored; rejects if the download gives up. */
  waitRun(run: PieceRun): Promise<void> {
    if (this.failure) return Promise.reject(this.failure);
    if (this.runStored(run)) return Promise.resolve();
    return new Promise((resolve, reject) => this.runWaiters.push({ run, resolve, reject }));
  }

  /** Called for every piece the task stores, whoever brought it. */
  pieceStored(index: number, provenance: PieceProvenance, length: number): void {
    this.wanted.delete(index);
    this.lastProgress = Date.now();
    this.report({
      packet: 'pieceFinished',
      pieceFinished: {
        index,
        // Always a SHA-256 in a swarm peer (its tasks keep sha256 piece checks).
        digest: provenance.sha256 ? `sha256:${provenance.sha256}` : '',
        parentId: provenance.parentId ?? '',
        costMs: Math.round(provenance.costMs ?? 0),
        fromOrigin: provenance.from === 'origin',
        length,
      },
    });
    for (const waiter of [...this.runWaiters]) {
      if (this.runStored(waiter.run)) {
        this.runWaiters.splice(this.runWaiters.indexOf(waiter), 1);
        waiter.resolve();
      }
    }
    this.pump();
  }

  /** Registers a blob this peer already holds whole (after a restart), so others can fetch from it. */
  announceHolding(): void {
    if (this.connectStarted || this.finished) return;
    // Still 'connecting': the finished report waits in `unsent` until the register is sent.
    this.connect();
    this.completed();
  }

  /** The whole blob is stored and verified: say so, and stay on as a holder. */
  completed(): void {
    if (this.finished) return;
    this.finished = true;
    clearTimeout(this.idleTimer);
    this.report({ packet: 'downloadFinished', downloadFinished: {} });
    for (const link of this.links.values()) link.close();
    this.links.clear();
    if (this.watchdog) clearInterval(this.watchdog);
  }

  /** The blob failed verification or was evicted: leave the task. */
  close(reason: string): void {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.idleTimer);
    if (this.watchdog) clearInterval(this.watchdog);
    for (const link of this.links.values()) link.close();
    for (const attempts of this.attempts.values()) for (const attempt of attempts) attempt.controller.abort();
    if (this.stream) {
      if (!this.finished) this.report({ packet: 'downloadFailed', downloadFailed: { message: reason } });
      this.stream.end();
    }
    this.giveUp(new Error(`swarm download of ${this.task.digest} closed: ${reason}`));
    this.onClosed(this);
  }

  // ---- scheduler stream

  private connectStarted = false;

  private connect(): void {
    this.connectStarted = true;
    const tried = new Set<string>();
    const attempt = async (): Promise<void> => {
      const address = this.schedulers.schedulersFor(this.task.digest).find((a) => !tried.has(a));
      if (!address) return this.finished ? undefined : this.goToOrigin('no scheduler reachable');
      tried.add(address);
      if (!(await this.schedulers.ready(address))) return attempt();
      if (this.closed) return;
      // ready() awaited: the peer may have begun shutting down, or the scheduler left the list.
      if (this.schedulers.closed) return;
      let stream: PeerStream;
      try {
        stream = this.schedulers.openStream(address);
      } catch (error) {
        this.log.warn({ task: this.task.digest, scheduler: address, err: (error as Error).message }, 'could not open a stream; trying the next scheduler');
        return attempt();
      }
      this.schedulerAddress = address;
      this.stream = stream;
      let answered = false;
      stream.on('data', (packet: SchedulerPacket) => {
        answered = true;
        this.onPacket(packet);
      });
      const lost = (error?: Error) => {
        if (this.stream !== stream) return;
        this.stream = undefined;
        if (this.closed) return;
        this.schedulers.markUnhealthy(address);
        // The task moves to the next scheduler (re-registering with the pieces held, so a
        // finished peer stays a parent); only when none is left does the peer read the origin.
        const moment = !answered ? 'before answering' : this.finished ? 'after the download' : 'mid-download';
        this.log.warn({ task: this.task.digest, scheduler: address, err: error?.message }, `lost the scheduler ${moment}; trying the next`);
        void attempt();
      };
      stream.on('error', (error: Error) => lost(error));
      stream.on('end', () => lost());
      const origin = this.originRequest();
      // A new scheduler knows nothing of an earlier idle: it schedules this peer afresh.
      this.idleReported = false;
      stream.write({
        packet: 'register',
        register: {
          peerId: this.peerId,
          hostId: this.settings.hostId,
          taskId: this.task.digest,
          contentLength: this.task.size,
          pieceSize: this.task.layout.pieceSize,
          origin,
          heldPieces: [...Array(this.task.layout.pieceCount).keys()].filter((i) => this.task.hasPiece(i)),
        },
      });
      const pending = this.unsent.splice(0);
      for (const packet of pending) stream.write(packet);
      // Moved to another scheduler after finishing: it should know this peer holds the blob whole.
      if (this.finished && !pending.some((p) => p.packet === 'downloadFinished')) {
        stream.write({ packet: 'downloadFinished', downloadFinished: {} });
      }
    };
    this.watchdog ??= setInterval(() => this.checkProgress(), WATCHDOG_INTERVAL_MS);
    this.watchdog.unref();
    void attempt();
  }

  /**
   * Where the blob comes from, as the scheduler may know it: the registry's blob URL (its task is
   * per registry) and whether the registry gives it to anyone. Never the client's credentials.
   */
  private originRequest(): OriginRequest | null {
    const source = this.task.blob.sources[0];
    if (!source?.registry) return null;
    return { url: blobUrl({ ...source, digest: this.task.digest }).href, headers: {}, public: source.public };
  }

  /**
   * What a parent needs to give this peer pieces: the blob URL this peer's client named and,
   * for a private blob (sent over TLS only), that client's credentials for the parent to check.
   */
  private clientHeaders(): Record<string, string> {
    const client = this.origin?.client;
    if (!client) return {};
    const headers: Record<string, string> = { [CLIENT_ORIGIN_HEADER]: client.url.href };
    if (this.settings.tls && client.authorization && !this.task.blob.sources[0]?.public) headers[CLIENT_AUTHORIZATION_HEADER] = client.authorization;
    return headers;
  }

  private report(packet: PeerPacket): void {
    if (this.stream && !this.stream.writableEnded) this.stream.write(packet);
    else if (this.mode === 'connecting') this.unsent.push(packet);
  }

  private onPacket(packet: SchedulerPacket): void {
    switch (packet.packet) {
      case 'digests':
        for (const [index, digest] of Object.entries(packet.digests.digests ?? {})) this.digests.set(Number(index), digest);
        break;
      case 'parents':
        if (this.mode === 'connecting') this.mode = 'swarm';
        this.setParents(packet.parents.parents ?? []);
        break;
      case 'wait':
        if (this.mode === 'connecting') this.mode = 'swarm';
        this.log.debug({ task: this.task.digest, reason: packet.wait.reason }, 'scheduler says wait');
        break;
      case 'backToSource':
        this.log.info({ task: this.task.digest, reason: packet.backToSource.reason }, 'scheduler sends this peer to the origin');
        this.goToOrigin(packet.backToSource.reason);
        return;
    }
    this.pump();
  }

  private setParents(parents: ParentInfo[]): void {
    this.log.debug({ task: this.task.digest, parents: parents.map((p) => p.peerId) }, 'parents from the scheduler');
    const keep = new Set(parents.map((p) => p.peerId));
    for (const [id, link] of this.links) {
      if (!keep.has(id)) {
        link.retire();
        this.links.delete(id);
      }
    }
    for (const info of parents) {
      if (this.links.has(info.peerId) || this.blocked.has(info.peerId) || info.hostId === this.settings.hostId) continue;
      const link = new ParentLink(
        info,
        this.task.digest,
        this.task.layout.pieceCount,
        this.dispatcher,
        { authorization: `Bearer ${this.settings.clusterToken}`, ...this.clientHeaders() },
        this.settings.tls,
        this.log,
        () => this.pump(),
        (dead, error) => this.dropParent(dead, 'FAILURE_REASON_PARENT_UNREACHABLE', error.message),
      );
      this.links.set(info.peerId, link);
      link.start();
    }
  }

  private dropParent(link: ParentLink, reason: FailureReason, message: string, index = -1): void {
    if (!this.links.has(link.id)) return;
    link.close();
    this.links.delete(link.id);
    this.blocked.add(link.id);
    this.settings.onParentDropped?.(reason);
    this.log.warn({ task: this.task.digest, parent: link.id, reason, message }, 'dropping parent');
    this.report({ packet: 'pieceFailed', pieceFailed: { index, parentId: link.id, reason, message } });
    this.pump();
  }

  // ---- fetching from parents

  private pump(): void {
    if (this.mode !== 'swarm' || this.closed || this.failure) return;
    const inflightPieces = this.attempts.size;
    let budget = this.settings.parallelism - inflightPieces;
    const order = this.candidateOrder();
    for (const index of order) {
      if (budget <= 0) break;
      const link = this.bestLinkFor(index);
      if (!link) continue;
      this.startAttempt(index, link);
      budget--;
    }
    if (order.length === 0 && this.attempts.size > 0) this.endgame();
    if (this.wanted.size === 0 && this.attempts.size === 0) this.idleSoon();
  }

  /** Wanting nothing (a lazy reader served): gives the parents back if that lasts IDLE_AFTER_MS. */
  private idleSoon(): void {
    if (this.idleReported || this.idleTimer || this.finished) return;
    this.idleTimer = setTimeout(() => {
      this.idleTimer = undefined;
      if (this.closed || this.finished || this.idleReported || this.mode !== 'swarm' || this.wanted.size > 0 || this.attempts.size > 0) return;
      this.idleReported = true;
      this.report({ packet: 'idle', idle: {} });
    }, IDLE_AFTER_MS);
    this.idleTimer.unref();
  }

  /**
   * Wanted pieces that can be fetched now, best first (policy/candidate-order.ts). A piece still
   * arriving at a parent counts: the parent relays it as it comes. Only pieces whose digest the
   * scheduler has vouched for are asked for: a digest that never comes (its report lost with a
   * scheduler) would keep an attempt waiting, and a peer with attempts on their way never falls
   * back to the origin.
   */
  private candidateOrder(): number[] {
    const available: Candidate[] = [];
    for (const index of this.wanted) {
      if (this.task.hasPiece(index) || this.attempts.has(index) || !this.digests.has(index)) continue;
      let holders = 0;
      let nodeHolders = 0;
      for (const link of this.links.values()) {
        if (!link.offers(index)) continue;
        holders++;
        if (!link.seed) nodeHolders++;
      }
      if (holders > 0) available.push({ index, holders, nodeHolders });
    }
    return orderCandidates(available, (index) => this.tieBreak[index] ?? 0, this.task.streamingReaders > 0);
  }

  /** The parent to ask for a piece now (policy/parent-choice.ts). */
  private bestLinkFor(index: number, except?: ParentLink): ParentLink | undefined {
    return bestParentFor(index, this.links.values(), this.parentChoice(), except);
  }

  private parentChoice(): ParentChoice<ParentLink> {
    return {
      now: Date.now(),
      perParent: this.settings.perParent,
      hasNodeParents: [...this.links.values()].some((link) => !link.seed),
      uploading: (link) => this.uploadsFrom(link),
    };
  }

  /** Pieces `link` is still sending to this peer (policy stillUploading: not one whose last byte alone is held back). */
  private uploadsFrom(link: ParentLink): number {
    let count = 0;
    for (const attempts of this.attempts.values()) {
      for (const attempt of attempts) {
        if (attempt.link === link && stillUploading(attempt.growing?.filled, attempt.length)) count++;
      }
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
    for (const [index, attempts] of this.attempts) {
      // A piece just stored is still listed until its attempt settles: it needs no second parent.
      const first = attempts[0];
      if (!first || attempts.length !== 1 || this.task.hasPiece(index)) continue;
      const link = this.bestLinkFor(index, first.link);
      if (!link) continue;
      const progress = { receivedBytes: first.growing?.filled ?? 0, elapsedMs: now - first.started };
      if (wantsSecondParent(progress, link.rate)) this.startAttempt(index, link);
    }
  }

  private startAttempt(index: number, link: ParentLink): void {
    const { length } = pieceBounds(this.task.layout, index);
    const attempt: Attempt = { link, controller: new AbortController(), started: Date.now(), length };
    const list = this.attempts.get(index) ?? [];
    list.push(attempt);
    this.attempts.set(index, list);
    link.inflight++;
    let timedOut = false;
    let stored = false;
    // A stall, not a slow piece, is given up (policy/stall.ts).
    let seen = -1;
    let lastMoved = Date.now();
    const timer = setInterval(() => {
      const filled = attempt.growing?.filled ?? -1;
      if (filled !== seen) {
        seen = filled;
        lastMoved = Date.now();
      } else if (Date.now() - lastMoved >= this.settings.pieceTimeoutMs) {
        timedOut = true;
        attempt.controller.abort();
      }
    }, pieceCheckIntervalMs(this.settings.pieceTimeoutMs));
    void link
      .fetchPiece(
        index,
        () => {
          const growing = (attempt.growing = this.beginPiece(index));
          // All but the byte a relaying parent holds back until its own check: its upload to us is
          // over, and the next piece may be asked of it while this one is checked and stored.
          void growing.next(length - 2).then(() => {
            if (!this.closed && !attempt.controller.signal.aborted) this.pump();
          });
          return growing;
        },
        attempt.controller.signal,
      )
      .then(async (bytes) => {
        const sha256 = await sha256Hex(bytes);
        if (`sha256:${sha256}` !== this.digests.get(index)) {
          this.dropParent(link, 'FAILURE_REASON_BAD_PIECE', `piece ${index} does not match its digest`, index);
          return;
        }
        for (const other of this.attempts.get(index) ?? []) if (other !== attempt) other.controller.abort();
        await this.task.storePiece(index, bytes, {
          from: link.info.seed ? 'seed' : 'peer',
          parentId: link.id,
          sha256,
          costMs: Date.now() - attempt.started,
        });
        stored = true;
      })
      .catch((error: Error) => {
        if (timedOut) {
          this.report({
            packet: 'pieceFailed',
            pieceFailed: { index, parentId: link.id, reason: 'FAILURE_REASON_PARENT_SLOW', message: `no byte of the piece for ${this.settings.pieceTimeoutMs} ms` },
          });
        } else if (attempt.controller.signal.aborted || error instanceof ParentBusyError || error instanceof PieceCutShortError) {
          // Lost the endgame race, the parent is busy, or a piece it relayed was given up
          // upstream: another parent or a later pump will do.
        } else if (error instanceof PieceMissingError) {
          this.report({ packet: 'pieceFailed', pieceFailed: { index, parentId: link.id, reason: 'FAILURE_REASON_PIECE_MISSING', message: error.message } });
        } else if (++link.consecutiveFailures >= 2) {
          this.dropParent(link, 'FAILURE_REASON_PARENT_UNREACHABLE', error.message, index);
        }
      })
      .finally(() => {
        clearInterval(timer);
        attempt.growing?.end();
        link.inflight--;
        link.pieceSettled();
        const remaining = (this.attempts.get(index) ?? []).filter((a) => a !== attempt);
        if (remaining.length) this.attempts.set(index, remaining);
        else this.attempts.delete(index);
        if (this.closed) return;
        // Sent to the origin meanwhile: the origin reads skipped this piece while it was on its way.
        if (this.mode === 'origin') return this.fetchFromOrigin();
        // The next piece at once after a good one: in a pipeline the child's only parent is free
        // again only now, and every millisecond idle here is lost by every peer down the chain.
        // A busy or failing parent is asked again a little later rather than at once.
        if (stored) this.pump();
        else setTimeout(() => this.pump(), RETRY_AFTER_FAILED_PIECE_MS).unref();
      });
  }

  /**
   * Opens a piece's relay buffer as its bytes start to arrive, and says so to the scheduler: this
   * peer can serve the piece to children at once, so it may be handed as a parent already.
   */
  private beginPiece(index: number, fromOrigin = false): GrowingPiece {
    const growing = this.task.beginPiece(index, fromOrigin);
    this.report({ packet: 'pieceStarted', pieceStarted: { index } });
    return growing;
  }

  // ---- falling back to the origin

  private checkProgress(): void {
    if (this.closed || this.finished || this.mode === 'origin' || this.wanted.size === 0) return;
    this.pump(); // parents that were busy may have free slots again
    const idle = Date.now() - this.lastProgress;
    const verdict = stallVerdict(idle, this.settings.stallMs, this.attempts.size);
    if (verdict === 'origin') this.goToOrigin(`nothing stored for ${idle} ms`);
    else if (verdict === 'reschedule') this.report({ packet: 'reschedule', reschedule: { blocklist: [...this.blocked] } });
  }

  private goToOrigin(reason: string): void {
    if (this.mode === 'origin' && reason !== 'retry') {
      this.fetchFromOrigin();
      return;
    }
    this.mode = 'origin';
    this.log.debug({ task: this.task.digest, reason }, 'fetching from the origin');
    this.fetchFromOrigin();
  }

  /** Reads every wanted piece not yet stored or on its way, in contiguous runs, from the origin. */
  private fetchFromOrigin(): void {
    if (!this.origin || this.closed || this.failure) return;
    const missing = [...this.wanted].filter((i) => !this.task.hasPiece(i) && !this.originBusy.has(i) && !this.attempts.has(i)).sort((a, b) => a - b);
    // Each run on a connection of its own, the blob's last piece (a lazy puller's TOC) first.
    for (const run of originRuns(missing, this.task.layout.pieceCount)) {
      for (let i = run.first; i <= run.last; i++) this.originBusy.add(i);
      void this.origin
        .fetchRun(this.task.layout, run, (index, bytes) => this.task.storePiece(index, bytes, { from: 'origin' }), undefined, (index) =>
          this.beginPiece(index, true),
        )
        .catch((error: Error) => {
          this.log.warn({ task: this.task.digest, err: error.message, attempt: this.originAttempts }, 'origin fetch failed');
          // The blob's recorded size is wrong or the origin lies about it: drop the task (closing this download).
          if (error instanceof BlobSizeMismatchError) return void this.task.fail(error).catch(() => undefined);
          if (++this.originAttempts > 3) this.giveUp(error);
        })
        .finally(() => {
          for (let i = run.first; i <= run.last; i++) this.originBusy.delete(i);
          if (!this.failure && !this.closed && [...this.wanted].some((i) => !this.task.hasPiece(i))) this.goToOrigin('retry');
        });
    }
  }

  private giveUp(error: Error): void {
    if (this.failure) return;
    this.failure = error;
    for (const waiter of this.runWaiters.splice(0)) waiter.reject(error);
  }

  private runStored(run: PieceRun): boolean {
    for (let index = run.first; index <= run.last; index++) if (!this.task.hasPiece(index)) return false;
    return true;
  }
}
