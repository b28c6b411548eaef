import type { Dispatcher } from 'undici';
import type { Logger } from '../../common/log.js';
import type { ClientTls } from '../../common/tls.js';
import type { ClusterToken } from '../../common/token.js';
import type { FailureReason, SchedulerPacket } from '../../rpc/scheduler-api.js';
import { CLIENT_AUTHORIZATION_HEADER, CLIENT_ORIGIN_HEADER, type PieceSpan } from '../../rpc/upload-api.js';
import { pieceBounds } from '../../storage/piece-plan.js';
import type { BlobTask } from '../blob-task.js';
import type { GrowingPiece } from '../growing-piece.js';
import type { OriginSource } from '../sources/origin-source.js';
import type { PieceProvenance, PieceRun } from '../sources/piece-source.js';
import { ParentBusyError, type ParentLink } from './parent-link.js';
import { ParentSet } from './parent-set.js';
import { PiecesFromOrigin } from './pieces-from-origin.js';
import { PiecesFromParents } from './pieces-from-parents.js';
import { stallVerdict, WATCHDOG_INTERVAL_MS } from './policy/stall.js';
import type { SchedulerClient } from './scheduler-client.js';
import { SchedulerSession } from './scheduler-session.js';
import { WantedPieces } from './wanted-pieces.js';

export interface SwarmSettings {
  hostId: string;
  clusterToken: ClusterToken;
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

/** Where pieces come from: nowhere yet (the scheduler has not answered), parents, or the origin. */
type Mode = 'connecting' | 'swarm' | 'origin';

/**
 * Wanting nothing for this long, a peer gives its parents back (the scheduler's `idle`). Not at
 * once: a lazy reader's next request often follows within milliseconds, and holding a parent's
 * slot half a second longer costs little.
 */
const IDLE_AFTER_MS = 500;
/**
 * A span waits this long for the scheduler to name a parent that gives it; then the reader fetches
 * the whole piece. A parent that answers busy is waited for (up to SPAN_TIMEOUT_MS): the whole
 * piece would wait for the same slots, then cost a piece's bytes for the span's (twelve nodes
 * mounting four layers at once fetched whole pieces around their 1.6 MB prefetch spans).
 */
const SPAN_PARENT_WAIT_MS = 5_000;
/** A span whose parent sends nothing for this long is given up (the reader fetches the whole piece). */
const SPAN_TIMEOUT_MS = 30_000;
/** With no parent free for a span, look again this often (a busy parent's backoff ends without news). */
const SPAN_RETRY_MS = 250;

/**
 * One task's download through the swarm: what its clients want (WantedPieces), its scheduler
 * stream (SchedulerSession), the parents the scheduler names (ParentSet), pieces fetched from
 * them (PiecesFromParents) or from the origin when the scheduler says so or the swarm stalls
 * (PiecesFromOrigin). Pieces go one way, source → check → task; the task's word that a piece
 * was stored only updates what is wanted and tells the scheduler. After completion the
 * download stays registered as a holder for others.
 */
export class SwarmDownload {
  private mode: Mode = 'connecting';
  private readonly wanted: WantedPieces;
  private readonly session: SchedulerSession;
  private readonly parents: ParentSet;
  private readonly fromParents: PiecesFromParents;
  private readonly fromOrigin: PiecesFromOrigin;
  private lastProgress = Date.now();
  private watchdog?: NodeJS.Timeout;
  private finished = false;
  private closed = false;
  /** Told the scheduler it wants nothing (so it holds no parents), and has not asked again since. */
  private idleReported = false;
  private idleTimer?: NodeJS.Timeout;
  /** Spans being read from parents: the peer is not idle while it reads them. */
  private spansReading = 0;
  /** Woken whenever the parents or what they hold change. */
  private parentNews = new Set<() => void>();

  constructor(
    readonly task: BlobTask,
    schedulers: SchedulerClient,
    dispatcher: Dispatcher,
    private readonly settings: SwarmSettings,
    private readonly log: Logger,
    private readonly onClosed: (download: SwarmDownload) => void,
  ) {
    this.wanted = new WantedPieces((index) => task.hasPiece(index));
    this.session = new SchedulerSession(task, this.peerId, settings.hostId, schedulers, log, {
      packet: (packet) => this.onPacket(packet),
      registered: () => {
        this.idleReported = false; // a new scheduler schedules this peer afresh
        this.fromParents.schedulerGone(false);
      },
      noScheduler: () => {
        if (this.finished) return;
        this.fromParents.schedulerGone(true);
        // Mid-download with every missing piece's digest known, the parents held can bring the rest:
        // going on with them (the origin once they stall) spares the registry a copy per peer when
        // the only scheduler restarts. A piece with no digest yet could be checked by no one (the
        // scheduler passes them on), and with no answer yet there is nothing to go on: the origin.
        if (this.mode === 'swarm' && this.fromParents.canCheckEveryMissingPiece())
          this.log.info({ task: this.task.digest }, 'every scheduler lost; going on with the parents held');
        else this.goToOrigin(this.mode === 'swarm' ? 'no scheduler reachable, and pieces without a digest' : 'no scheduler reachable');
      },
    });
    this.parents = new ParentSet(task.digest, task.layout.pieceCount, dispatcher, settings, () => this.clientHeaders(), log, {
      news: () => {
        this.wakeSpanReaders();
        this.pump();
      },
      dropped: (link, reason, message, index) => {
        settings.onParentDropped?.(reason);
        this.session.report({ packet: 'pieceFailed', pieceFailed: { index, parentId: link.id, reason, message } });
        this.pump(); // without node parents, a seed may send more pieces at once
      },
    });
    this.fromParents = new PiecesFromParents(
      task,
      this.wanted,
      this.parents,
      settings,
      {
        report: (packet) => this.session.report(packet),
        beginPiece: (index, parentId) => this.beginPiece(index, parentId),
        settled: () => this.attemptSettled(),
        putOff: () => (this.lastProgress = Date.now()),
      },
      log,
    );
    this.fromOrigin = new PiecesFromOrigin(task, this.wanted, (index) => this.fromParents.isOnItsWay(index), log, {
      beginPiece: (index) => this.beginPiece(index),
      gaveUp: (error) => this.wanted.fail(error),
    });
  }

  /** Since when the scheduler says the registry's swarm reads on demand, or undefined (policy/background-put-off.ts). */
  get swarmReadingSince(): number | undefined {
    return this.fromParents.swarmReadingSince;
  }

  get peerId(): string {
    return `${this.settings.hostId}|${this.task.digest}`;
  }

  /** Adds pieces to fetch; `origin` is how this caller would read the origin (its credentials). */
  want(run: PieceRun, origin: OriginSource): void {
    if (this.wanted.failed) return;
    this.fromOrigin.use(origin);
    const wasIdle = this.wanted.size === 0;
    const added = this.wanted.add(run);
    if (added && wasIdle) this.lastProgress = Date.now();
    if (added) this.resumeIfWanting();
    if (!this.session.started) this.start();
    if (this.mode === 'origin') this.fromOrigin.read();
    else this.pump();
  }

  /** How this peer reads the origin for the task (its first client's way), while the download goes on. */
  get origin(): OriginSource | undefined {
    return this.finished || this.wanted.failed ? undefined : this.fromOrigin.origin;
  }

  /**
   * Reads part of piece `index` for a reader that checks it against a verified TOC
   * (piece-spans.ts): from the origin when the scheduler sent this peer there, else from a parent,
   * preferring one that holds or receives the piece (any other reads the span upstream in turn).
   * Joins the task's swarm if this peer has not; throws when no parent answers, and the caller
   * fetches the whole piece instead.
   */
  async readSpan(index: number, span: PieceSpan, hops: number, into: GrowingPiece, origin?: OriginSource): Promise<void> {
    if (this.closed || this.wanted.failed) throw new Error(`swarm download of ${this.task.digest} is closed`);
    if (origin) this.fromOrigin.use(origin);
    this.spansReading++;
    try {
      if (!this.session.started) this.start();
      else if (this.idleReported) {
        this.idleReported = false;
        this.session.report({ packet: 'reschedule', reschedule: { blocklist: this.parents.blocklist } });
      }
      // Only a read for this peer's own reader says the swarm reads on demand; a relayed one was said downstream.
      if (hops === 0) this.session.report({ packet: 'spanRead', spanRead: {} });
      const { offset } = pieceBounds(this.task.layout, index);
      const signal = AbortSignal.timeout(SPAN_TIMEOUT_MS);
      let deadline = Date.now() + SPAN_PARENT_WAIT_MS;
      const tried = new Set<ParentLink>();
      for (;;) {
        if (this.closed) throw new Error(`swarm download of ${this.task.digest} is closed`);
        const reader = this.mode === 'origin' ? this.fromOrigin.origin : undefined;
        if (reader) return await reader.readRange(offset + span.start, offset + span.end, into, signal);
        const link = this.parentForSpan(index, tried);
        if (link) {
          try {
            return await link.fetchSpan(index, span, hops, into, signal);
          } catch (error) {
            // Bytes already handed on cannot be taken back: a span cut short fails.
            if (into.filled > 0 || signal.aborted) throw error;
            // A busy parent is asked again once its backoff is over; any other answer is final.
            if (error instanceof ParentBusyError) deadline = Math.max(deadline, Date.now() + SPAN_PARENT_WAIT_MS);
            else tried.add(link);
            this.log.debug({ task: this.task.digest, index, parent: link.id, err: (error as Error).message }, 'span not read from parent');
            continue;
          }
        }
        if (Date.now() >= deadline || signal.aborted) throw new Error(`no parent gave bytes ${span.start}-${span.end} of piece ${index}`);
        await this.parentNewsOrTimeout(Math.min(deadline - Date.now(), SPAN_RETRY_MS));
      }
    } finally {
      this.spansReading--;
      this.idleIfNothingWanted();
    }
  }

  /** A parent to ask for a span: one holding or receiving the piece first, then one that fetches what it is asked. */
  private parentForSpan(index: number, tried: ReadonlySet<ParentLink>): ParentLink | undefined {
    const now = Date.now();
    let fallback: ParentLink | undefined;
    for (const link of this.parents.forSpans()) {
      if (tried.has(link) || link.closed || link.busyUntil > now) continue;
      if (link.carries(index)) return link;
      // A seed named for spans reads any span from the origin; its bitmap is not followed.
      if (link.onDemand || link.seed) fallback ??= link;
    }
    return fallback;
  }

  private parentNewsOrTimeout(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, Math.max(0, ms));
      const parentNews = this.parentNews;
      function done() {
        clearTimeout(timer);
        parentNews.delete(done);
        resolve();
      }
      parentNews.add(done);
    });
  }

  private wakeSpanReaders(): void {
    for (const wake of [...this.parentNews]) wake();
  }

  /** Resolves once every piece of the run is stored; rejects if the download gives up. */
  waitRun(run: PieceRun): Promise<void> {
    return this.wanted.wait(run);
  }

  /** The task stored a piece, whoever brought it: what is wanted shrinks, and the scheduler hears of it. */
  pieceStored(index: number, provenance: PieceProvenance, length: number): void {
    this.wanted.stored(index);
    this.lastProgress = Date.now();
    this.session.report({
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
  }

  /**
   * A seed serving the task's pieces as children ask (Swarm.fetchForChild): registered now,
   * wanting nothing yet, so the scheduler sends it to the origin and names it as a parent.
   */
  serveOnDemand(origin: OriginSource): void {
    if (this.wanted.failed || this.finished) return;
    this.fromOrigin.use(origin);
    if (!this.session.started) this.start();
  }

  /** Registers a blob this peer already holds whole (after a restart), so others can fetch from it. */
  announceHolding(): void {
    if (this.session.started || this.finished) return;
    // Still 'connecting': the finished report waits until the register is sent.
    this.start();
    this.completed();
  }

  /** The whole blob is stored and verified: say so, and stay on as a holder. */
  completed(): void {
    if (this.finished) return;
    this.finished = true;
    clearTimeout(this.idleTimer);
    this.session.finish();
    this.parents.closeAll();
    if (this.watchdog) clearInterval(this.watchdog);
  }

  /** The blob failed verification or was evicted: leave the task. */
  close(reason: string, contentMismatch = false): void {
    if (this.closed) return;
    this.closed = true;
    this.wakeSpanReaders();
    clearTimeout(this.idleTimer);
    if (this.watchdog) clearInterval(this.watchdog);
    this.fromParents.stop();
    this.fromOrigin.stop();
    this.parents.closeAll();
    this.session.close(reason, contentMismatch);
    this.wanted.fail(new Error(`swarm download of ${this.task.digest} closed: ${reason}`));
    this.onClosed(this);
  }

  private start(): void {
    this.session.open();
    this.watchdog ??= setInterval(() => this.checkProgress(), WATCHDOG_INTERVAL_MS);
    this.watchdog.unref();
  }

  private onPacket(packet: SchedulerPacket): void {
    switch (packet.packet) {
      case 'digests':
        this.fromParents.vouch(packet.digests);
        if (packet.digests.confirmed) this.task.confirmPieces(packet.digests.digests ?? {});
        if (packet.digests.forgetVouched && this.task.holdsUnverifiedPieces()) {
          // Some peer's copy failed the blob's digest: what this one holds unverified may be the lie.
          void this.task.fail(new Error(`a peer's copy of ${this.task.digest} failed its digest: pieces not verified are dropped`));
          return;
        }
        break;
      case 'parents':
        this.useParents();
        this.parents.follow(packet.parents.parents ?? []);
        // Parents of its own now: they pass spans on (the seeds named while it waited are let go).
        if (packet.parents.parents?.length) this.parents.spanSources([]);
        this.wakeSpanReaders();
        this.giveUpRetiredStragglers();
        break;
      case 'swarmReading':
        this.fromParents.swarmReading(packet.swarmReading.onDemand);
        this.resumeIfWanting();
        this.pump();
        break;
      case 'wait':
        this.useParents();
        this.parents.spanSources(packet.wait.spanSources ?? []);
        this.wakeSpanReaders();
        this.log.debug({ task: this.task.digest, reason: packet.wait.reason }, 'scheduler says wait');
        break;
      case 'backToSource':
        this.log.info({ task: this.task.digest, reason: packet.backToSource.reason }, 'scheduler sends this peer to the origin');
        this.goToOrigin(packet.backToSource.reason);
        this.wakeSpanReaders();
        return;
    }
    this.pump();
  }

  /** The scheduler's first answer (parents, or wait for them): pieces come from parents. */
  private useParents(): void {
    if (this.mode !== 'connecting') return;
    this.mode = 'swarm';
    this.session.answered();
    this.fromParents.run();
  }

  /**
   * What a parent needs to give this peer pieces: the blob URL this peer's client named and,
   * for a private blob (sent over TLS only), that client's credentials for the parent to check.
   */
  private clientHeaders(): Record<string, string> {
    const client = this.fromOrigin.client;
    if (!client) return {};
    const headers: Record<string, string> = { [CLIENT_ORIGIN_HEADER]: client.url.href };
    if (this.settings.tls && client.authorization && !this.task.blob.sources[0]?.public)
      headers[CLIENT_AUTHORIZATION_HEADER] = client.authorization;
    return headers;
  }

  /**
   * Opens a piece's relay buffer as its bytes start to arrive, and says so to the scheduler: this
   * peer can serve the piece to children at once, so it may be handed as a parent already.
   * `parentId`: the parent sending it (absent: the origin).
   */
  private beginPiece(index: number, parentId?: string): GrowingPiece {
    const growing = this.task.beginPiece(index, parentId === undefined);
    const background = this.task.wantedInBackgroundOnly(index);
    this.session.report({ packet: 'pieceStarted', pieceStarted: { index, background, parentId } });
    return growing;
  }

  private pump(): void {
    if (this.closed) return;
    this.fromParents.pump();
    this.idleIfNothingWanted();
  }

  /** An attempt at a parent ended. Sent to the origin meanwhile: the origin reads skipped its piece while it was on its way. */
  private attemptSettled(): void {
    if (this.closed) return;
    if (this.mode === 'origin') this.fromOrigin.read();
    else this.idleIfNothingWanted();
  }

  /**
   * Nothing to fetch now: nothing wanted (a lazy reader served), or only background pieces, which
   * wait while the swarm reads on demand (policy/background-put-off.ts).
   */
  private wantsNothingNow(): boolean {
    return this.wanted.size === 0 || this.fromParents.waitsForSwarmOnly(Date.now());
  }

  /**
   * Wanting nothing now: gives the parents back if that lasts IDLE_AFTER_MS. Held background pieces
   * count as nothing: kept, the parents' upload slots would wait with them while other nodes'
   * starts waited for a slot (a seed's eight slots, end to end).
   */
  private idleIfNothingWanted(): void {
    const busy = () => this.mode !== 'swarm' || !this.wantsNothingNow() || this.fromParents.onTheirWay > 0 || this.spansReading > 0;
    if (busy() || this.idleReported || this.idleTimer || this.finished) return;
    this.idleTimer = setTimeout(() => {
      this.idleTimer = undefined;
      if (this.closed || this.finished || this.idleReported || busy()) return;
      this.idleReported = true;
      this.session.report({ packet: 'idle', idle: {} });
    }, IDLE_AFTER_MS);
    this.idleTimer.unref();
  }

  /** Parents again, now, if this peer said it was idle and wants pieces it may fetch: the scheduler gave them to others meanwhile. */
  private resumeIfWanting(): void {
    if (!this.idleReported || this.wantsNothingNow()) return;
    this.idleReported = false;
    this.session.report({ packet: 'reschedule', reschedule: { blocklist: this.parents.blocklist } });
  }

  /** The watchdog: parents that were busy may have free slots again; a stalled download asks for help (policy/stall.ts). */
  private checkProgress(): void {
    if (this.closed || this.finished || this.mode === 'origin' || this.wanted.size === 0) return;
    this.resumeIfWanting(); // a swarm that read on demand past SWARM_READING_HOLD_MAX_MS holds background pieces no longer
    this.giveUpRetiredStragglers();
    this.pump();
    if (this.fromParents.waitsForSwarmOnly(Date.now())) {
      this.lastProgress = Date.now(); // waiting on purpose while other nodes start: no stall
      return;
    }
    const idle = Date.now() - this.lastProgress;
    const verdict = stallVerdict(idle, this.settings.stallMs, this.fromParents.onTheirWay, this.session.connected);
    if (verdict === 'origin') this.goToOrigin(`nothing stored for ${idle} ms`);
    else if (verdict === 'reschedule') this.session.report({ packet: 'reschedule', reschedule: { blocklist: this.parents.blocklist } });
  }

  private giveUpRetiredStragglers(): void {
    for (const index of this.fromParents.retiredStragglers()) {
      this.log.info(
        { task: this.task.digest, index },
        'piece on its way from a replaced parent arrives far slower than expected: asked anew',
      );
    }
  }

  private goToOrigin(reason: string): void {
    if (this.mode !== 'origin') {
      this.mode = 'origin';
      this.session.answered();
      this.fromParents.pause();
      this.log.debug({ task: this.task.digest, reason }, 'fetching from the origin');
    }
    this.fromOrigin.read();
  }
}
