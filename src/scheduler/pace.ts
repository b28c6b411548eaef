/**
 * What the scheduler measures of transfers, from the peers' own piece reports (PieceStarted,
 * PieceFinished; no probe traffic, nothing new on the wire): how fast each peer stores pieces,
 * when each piece began and ended, and what each host's links allow as far as seen. The adaptive
 * shape places peers by it (placement.ts, adaptive.ts). Rates are bytes per millisecond of the
 * scheduler's clock.
 */

/**
 * A transfer running below this share of what its feed allows is slow: the receiver's download or
 * the sender's upload holds it back. Also the margin by which one rate must beat another before
 * the scheduler acts on it (moving a peer costs its chain a piece's worth of overlap). Emulated
 * chains lose 4-10% per hop to framing and per-piece work, and a chain's first piece a third to
 * the seed reading the blob's last piece alongside its first: well inside it.
 */
export const SLOW = 0.7;

/** Stored pieces that make one intake measurement. */
const INTAKE_WINDOW = 3;

/** Pieces whose store times are kept for the bound on what a peer receives. */
const STORE_TIMES_KEPT = 16;

/**
 * The last few pieces of a transfer (or of several at once), to measure a rate over: their bytes
 * over the time from the earliest one's first byte to the newest one's end. Pieces that overlap
 * count once in the time, so pieces landing together do not read as a multiple of the rate.
 */
class PieceWindow {
  private readonly pieces: Array<{ start: number; length: number }> = [];

  /** When the first byte of the earliest piece kept arrived (Infinity: none). */
  get since(): number {
    let from = Infinity;
    for (const piece of this.pieces) from = Math.min(from, piece.start);
    return from;
  }

  /** A piece whose first byte came at `start` ended at `end`, the newest end: the rate over the last `kept` pieces, if measurable. */
  add(start: number, end: number, length: number, kept: number): number | undefined {
    this.pieces.push({ start: Math.min(start, end), length });
    while (this.pieces.length > Math.max(1, kept)) this.pieces.shift();
    let bytes = 0;
    for (const piece of this.pieces) bytes += piece.length;
    const from = this.since;
    return end > from ? bytes / (end - from) : undefined;
  }
}

/**
 * A peer's receive rate over its last few stored pieces (PieceWindow). An origin read, one stream
 * of pieces without starts of their own, is measured from when the stream began.
 */
export class Intake {
  private readonly window = new PieceWindow();
  private count = 0;
  private streamBytes = 0;
  /** Bytes per ms; undefined until measured. */
  rate?: number;

  /** Pieces recorded, the first one included. */
  get seen(): number {
    return this.count;
  }

  /** When the first byte of the earliest piece in the measurement arrived (Infinity: none). */
  get since(): number {
    return this.window.since;
  }

  /**
   * A piece whose first byte arrived at `start` was stored at `end`. A download's first piece is
   * left out: it carries the start of its chain (the seed's first piece shares the origin's link
   * with the blob's last, which it reads first), which no later piece pays.
   */
  record(start: number, end: number, length: number): void {
    if (++this.count === 1) return;
    this.rate = this.window.add(start, end, length, INTAKE_WINDOW) ?? this.rate;
  }

  /** A piece of a stream that began at `since` was stored at `end`. */
  recordStream(since: number, end: number, length: number): void {
    this.count++;
    this.streamBytes += length;
    if (end > since) this.rate = this.streamBytes / (end - since);
  }
}

/** One peer's transfers in one task, as its reports showed them. */
export class PeerPace {
  readonly intake = new Intake();
  /** The rate of its last piece that arrived alone (bytes per ms), and when that piece began. */
  lastPieceRate?: number;
  lastPieceStart = 0;
  /** When its last piece was stored. */
  lastStoredAt = 0;
  /** When it was sent to the origin (its origin reads are one stream from then). */
  originSince?: number;
  /** When each piece it fetched while registered was stored (a child's copy is judged against it). */
  readonly storedAt = new Map<number, number>();
  /** Its last few stored pieces: when their first byte came (absent: an origin read), when they were stored, their length. */
  private readonly storedSpans: Array<{ start?: number; end: number; length: number }> = [];
  /** The tightest bound found on what it receives while pieces arrived, and since when: acted on once per tightening. */
  slowArrival?: { since: number; rate: number };

  /**
   * How fast it receives now: its last piece's rate or its intake, whichever is higher (a chain
   * that sped up shows it in its last piece first). Undefined until measured.
   */
  get feedRate(): number | undefined {
    const intake = this.intake.rate;
    if (intake === undefined) return this.lastPieceRate;
    return this.lastPieceRate === undefined ? intake : Math.max(intake, this.lastPieceRate);
  }

  /**
   * A piece was stored at `now`. Its first byte arrived at `startedAt` (PieceStarted) when the peer
   * said so; else it took `costMs` from being asked for, as the peer measured it; else it came
   * from the origin, in one stream since the peer was sent there (or joined: `joinedAt`).
   * `arrivingStill`: other pieces are still on their way to the peer.
   */
  stored(
    index: number,
    length: number,
    now: number,
    startedAt: number | undefined,
    costMs: number,
    arrivingStill: boolean,
    joinedAt: number,
  ): void {
    this.lastStoredAt = now;
    this.storedSpans.push({ start: startedAt, end: now, length });
    if (this.storedSpans.length > STORE_TIMES_KEPT) this.storedSpans.shift();
    if (!this.storedAt.has(index)) this.storedAt.set(index, now);
    if (startedAt === undefined && !(costMs > 0)) this.intake.recordStream(this.originSince ?? joinedAt, now, length);
    else this.intake.record(startedAt ?? now - costMs, now, length);
    // A piece that shared the download with others reads low: taken only while nothing better is
    // known (a lower bound, and the first one comes a whole intake window before the intake).
    if (startedAt !== undefined && (!arrivingStill || this.lastPieceRate === undefined) && now > startedAt) {
      this.lastPieceRate = length / (now - startedAt);
      this.lastPieceStart = startedAt;
    }
  }

  /**
   * About what its download carried since `since` (bytes per ms): each of `arriving` pieces still
   * on their way whole, and of each piece stored since then the share that came after `since`
   * at the piece's own even pace (one begun earlier brought part of its bytes before). Pieces
   * stored without a start of their own (origin reads) count whole. Undefined when `now` is not
   * past `since`.
   */
  carriedSince(arriving: number, since: number, now: number, pieceSize: number): number | undefined {
    if (now <= since) return undefined;
    let bytes = arriving * pieceSize;
    for (const { start, end, length } of this.storedSpans) {
      if (end < since) continue;
      if (start === undefined) bytes += pieceSize;
      else bytes += end > start ? (length * (end - Math.max(start, since))) / (end - start) : length;
    }
    return bytes / (now - since);
  }

  /**
   * An upper bound on the rate it has received since the oldest of `arriving` (pieces on their
   * way: index → when their first byte came) began, or since `from` if later: every piece stored
   * since, plus every one of them still arriving, whole. Undefined while none arrives.
   */
  receiveBound(
    arriving: Array<[number, number]>,
    now: number,
    pieceSize: number,
    from = -Infinity,
  ): { since: number; rate: number } | undefined {
    let since = Infinity;
    for (const [, start] of arriving) since = Math.min(since, start);
    if (since === Infinity) return undefined;
    since = Math.max(since, from);
    if (now <= since) return undefined;
    let pieces = arriving.length;
    for (const { end } of this.storedSpans) if (end >= since) pieces++;
    return { since, rate: (pieces * pieceSize) / (now - since) };
  }
}

/**
 * What one host's links are known to allow, across its tasks. A cap is set when a transfer ran
 * slower than its feed allowed and is dropped when the host later does clearly better (a link
 * that got faster, or a cap put on the wrong end of a slow transfer).
 */
export class LinkKnowledge {
  /** The most it has been seen to receive (its download is at least this). */
  bestIntake = 0;
  /** The most its children together have been seen to receive from it (its upload is at least this). */
  bestDelivered = 0;
  /** What its children together received from it when last measured. */
  lastDelivered = 0;
  /** Pieces its children stored from it lately (see delivered). */
  private readonly sent = new PieceWindow();
  /** Its download holds its transfers to about this. */
  downCap?: number;
  /** The host whose transfer to it showed the cap: blamed instead if the cap turns out wrong. */
  downCapFrom?: string;
  /** Its upload holds its children together to about this. */
  upCap?: number;
  /** The upload limit its peer announced (--upload-rate-limit): known before anything is measured, never cleared. */
  uploadLimit?: number;

  /** The announced upload limit, in bytes per second (0: none). */
  announced(uploadBytesPerSecond: number): void {
    this.uploadLimit = uploadBytesPerSecond > 0 ? uploadBytesPerSecond / 1000 : undefined;
  }

  /** A receive rate seen now: raises the evidence, and clears a download cap it clearly beats. */
  sawIntake(rate: number): { clearedCapFrom?: string; cap?: number } {
    if (rate > this.bestIntake) this.bestIntake = rate;
    if (this.downCap !== undefined && rate * SLOW > this.downCap) {
      const cleared = { clearedCapFrom: this.downCapFrom, cap: this.downCap };
      this.downCap = undefined;
      this.downCapFrom = undefined;
      return cleared;
    }
    return {};
  }

  /**
   * A child stored a piece from this host whose first byte came at `start`: what its children
   * received together over its last `kept` such pieces (PieceWindow). Children served one after
   * another are not summed as if served at once: summing each child's last rate took a 50 Gbit/s
   * node for a 286 Gbit/s uploader, with room for dozens of children.
   */
  delivered(start: number, end: number, length: number, kept: number): void {
    const rate = this.sent.add(start, end, length, kept);
    if (rate !== undefined) this.sawDelivered(rate);
  }

  /** What its children together receive from it now: raises the evidence, and clears an upload cap it clearly beats. */
  private sawDelivered(rate: number): void {
    this.lastDelivered = rate;
    if (rate > this.bestDelivered) this.bestDelivered = rate;
    if (this.upCap !== undefined && rate * SLOW > this.upCap) this.upCap = undefined;
  }

  capDownload(rate: number, from: string): void {
    if (this.downCap === undefined || rate < this.downCap) {
      this.downCap = rate;
      this.downCapFrom = from;
    }
  }

  /**
   * A child's transfer from this host ran at `rate`, and the child's download turned out not to be
   * what held it. The upload is capped unless its children were last seen receiving clearly more
   * from it together: then the transfer was held by something else (its upload shared among many
   * children, the child's download shared with other pieces), and a cap would send a fast uploader
   * to ride, or starve a seed's chains. Returns whether it capped.
   */
  blameUpload(rate: number): boolean {
    if (this.lastDelivered * SLOW > rate) return false;
    if (this.upCap === undefined || rate < this.upCap) this.upCap = rate;
    return true;
  }

  /** Fed one child more, its children together took no more than `rate`: its upload is full. */
  foundUploadFull(rate: number): void {
    if (this.upCap === undefined || rate < this.upCap) this.upCap = rate;
  }

  /** Its upload is held to about this (a measured cap, or the announced limit). */
  get upload(): number | undefined {
    if (this.upCap === undefined) return this.uploadLimit;
    return Math.min(this.upCap, this.uploadLimit ?? Infinity);
  }

  /** The narrower of its caps, if it has one: it cannot feed a child faster. */
  get cap(): number | undefined {
    const up = this.upload;
    if (this.downCap === undefined) return up;
    if (up === undefined) return this.downCap;
    return Math.min(this.downCap, up);
  }
}
