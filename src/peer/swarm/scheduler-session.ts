import type { Logger } from '../../common/log.js';
import { blobUrl } from '../../oci/blob-url.js';
import type { OriginRequest, PeerPacket, SchedulerPacket } from '../../rpc/scheduler-api.js';
import type { BlobTask } from '../blob-task.js';
import type { PeerStream, SchedulerClient } from './scheduler-client.js';

/** The least time between a session giving up on every scheduler and trying them again. */
const REJOIN_PAUSE_MS = 1_000;

export interface SessionEvents {
  /** A packet from the scheduler. */
  packet(packet: SchedulerPacket): void;
  /** A scheduler took the register (a new one knows nothing of what this peer told the last). */
  registered(): void;
  /** No scheduler for the task is reachable (each tried once). */
  noScheduler(): void;
}

/**
 * One task's stream to its scheduler: registers the peer with the pieces it holds, carries the
 * peer's reports, and moves to the next scheduler for the task when one fails. Reports made
 * before the scheduler first answers wait for the stream.
 */
export class SchedulerSession {
  private stream?: PeerStream;
  private opened = false;
  /** Looking for a scheduler: between open (or a lost stream) and the next stream or giving up. */
  private connecting = false;
  /** Waiting for a scheduler to come back, to register again as a holder. */
  private stopRejoinWait?: () => void;
  private queueing = true;
  private readonly unsent: PeerPacket[] = [];
  private finished = false;
  private closed = false;

  constructor(
    private readonly task: BlobTask,
    private readonly peerId: string,
    private readonly hostId: string,
    private readonly schedulers: SchedulerClient,
    private readonly log: Logger,
    private readonly events: SessionEvents,
  ) {}

  get started(): boolean {
    return this.opened;
  }

  /** A stream to a scheduler is open (or being looked for): there is someone to ask for parents. */
  get connected(): boolean {
    return this.stream !== undefined || this.connecting;
  }

  /** Opens the stream (once): to the first scheduler for the task that is ready, then the next if it fails. */
  open(): void {
    if (this.opened) return;
    this.opened = true;
    this.connect();
  }

  /** Tries each scheduler for the task once, in order, moving on when a stream is lost. */
  private connect(): void {
    this.connecting = true;
    const tried = new Set<string>();
    const next = async (): Promise<void> => {
      const address = this.schedulers.schedulersFor(this.task.digest).find((a) => !tried.has(a));
      if (!address) {
        this.connecting = false;
        this.events.noScheduler();
        return this.rejoinLater();
      }
      tried.add(address);
      if (!(await this.schedulers.ready(address))) return next();
      // ready() awaited: this task or the whole peer may have been closed meanwhile.
      if (this.closed || this.schedulers.closed) return;
      let stream: PeerStream;
      try {
        stream = this.schedulers.openStream(address);
      } catch (error) {
        this.log.warn(
          { task: this.task.digest, scheduler: address, err: (error as Error).message },
          'could not open a stream; trying the next scheduler',
        );
        return next();
      }
      this.connecting = false;
      this.follow(address, stream, () => {
        this.connecting = true;
        void next();
      });
    };
    void next();
  }

  /**
   * A session left with no scheduler (each restarted or unreachable) registers again once one is
   * back, with the pieces it holds: otherwise a scheduler's restart, or a peer's own start-up while
   * the scheduler is away, would leave its pieces unknown to the swarm for as long as the peer runs,
   * and a download going on with its old parents would never be given new ones.
   */
  private rejoinLater(): void {
    if (this.closed || this.stream || this.connecting || this.stopRejoinWait || this.schedulers.closed) return;
    const retry = () => {
      this.stopRejoinWait = undefined;
      if (this.closed || this.stream || this.connecting) return;
      this.log.info({ task: this.task.digest, finished: this.finished }, 'a scheduler is reachable again; registering again');
      this.connect();
    };
    // One is reachable already (announced since this session gave up): try it after a pause, not at once.
    if (this.schedulers.anyReachable) {
      const timer = setTimeout(retry, REJOIN_PAUSE_MS);
      timer.unref();
      this.stopRejoinWait = () => clearTimeout(timer);
    } else {
      this.stopRejoinWait = this.schedulers.whenReachable(retry);
    }
  }

  private follow(address: string, stream: PeerStream, lost: () => void): void {
    this.stream = stream;
    let answered = false;
    stream.on('data', (packet: SchedulerPacket) => {
      answered = true;
      this.events.packet(packet);
    });
    const end = (error?: Error) => {
      if (this.stream !== stream) return;
      this.stream = undefined;
      if (this.closed) return;
      this.schedulers.markUnhealthy(address);
      // The task moves to the next scheduler (re-registering with the pieces held, so a
      // finished peer stays a parent); only when none is left does the peer read the origin.
      const moment = !answered ? 'before answering' : this.finished ? 'after the download' : 'mid-download';
      this.log.warn({ task: this.task.digest, scheduler: address, err: error?.message }, `lost the scheduler ${moment}; trying the next`);
      lost();
    };
    stream.on('error', (error: Error) => end(error));
    stream.on('end', () => end());
    this.events.registered();
    stream.write({
      packet: 'register',
      register: {
        peerId: this.peerId,
        hostId: this.hostId,
        taskId: this.task.digest,
        contentLength: this.task.size,
        pieceSize: this.task.layout.pieceSize,
        origin: this.originRequest(),
        heldPieces: [...Array(this.task.layout.pieceCount).keys()].filter((i) => this.task.hasPiece(i)),
      },
    });
    const pending = this.unsent.splice(0);
    for (const packet of pending) stream.write(packet);
    // Moved to another scheduler after finishing: it should know this peer holds the blob whole.
    if (this.finished && !pending.some((p) => p.packet === 'downloadFinished'))
      stream.write({ packet: 'downloadFinished', downloadFinished: {} });
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

  /** The scheduler has answered (parents, wait, or the origin): reports no longer wait for a stream. */
  answered(): void {
    this.queueing = false;
  }

  report(packet: PeerPacket): void {
    if (this.stream && !this.stream.writableEnded) this.stream.write(packet);
    else if (this.queueing) this.unsent.push(packet);
  }

  /** The whole blob is stored and verified: tells this scheduler and any the task moves to. */
  finish(): void {
    this.finished = true;
    this.report({ packet: 'downloadFinished', downloadFinished: {} });
  }

  /** Leaves the task; `failure` is told to the scheduler unless the download finished. */
  close(failure: string, contentMismatch = false): void {
    this.closed = true;
    this.stopRejoinWait?.();
    if (!this.stream) return;
    if (!this.finished) this.report({ packet: 'downloadFailed', downloadFailed: { message: failure, contentMismatch } });
    this.stream.end();
  }
}
