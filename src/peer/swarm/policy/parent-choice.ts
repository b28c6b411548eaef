/**
 * Which parent a peer asks for a piece, and how many pieces it asks of one parent at once.
 */

/** What the choice needs to know of a parent, as the child sees it. */
export interface ParentView {
  readonly seed: boolean;
  /** The scheduler's cap on pieces fetched from this parent at once, when it set one (a pipeline sets 1). */
  readonly piecesAtOnce: number | undefined;
  /** Pieces on their way from this parent to the child (every attempt, for "least busy"). */
  readonly inflight: number;
  /** Bytes per millisecond this parent served at lately (ParentPace), 0 before its first piece. */
  readonly rate: number;
  /** After a 429 the parent is left alone until then (milliseconds, the caller's clock). */
  readonly busyUntil: number;
  /** The parent holds the piece, is receiving it (and relays it as it arrives), or fetches it when asked (a seed on demand). */
  offers(index: number): boolean;
  /** The parent holds the piece stored and verified, as the child last heard. */
  holdsWhole(index: number): boolean;
}

export interface ParentChoice<P extends ParentView> {
  /** Now, on the clock of `busyUntil`. */
  now: number;
  /** Pieces fetched from one parent at once (the peer's `perParent`). */
  perParent: number;
  /** Some parent of the child is a node, not a seed. */
  hasNodeParents: boolean;
  /** Pieces the parent is still sending to the child (see stillUploading). */
  uploading(parent: P): number;
}

/**
 * How many pieces the child asks of a parent at once: the scheduler's cap when it set one; one
 * from a seed while the child has node parents to trade with (a seed's upload then carries
 * distinct pieces to many children instead of the same pieces to each); else `perParent`.
 */
export function parentPieceLimit(parent: ParentView, perParent: number, hasNodeParents: boolean): number {
  const cap = parent.piecesAtOnce;
  if (cap !== undefined && cap > 0) return cap;
  return parent.seed && hasNodeParents ? 1 : perParent;
}

/** Whether the child may ask this parent for one more piece now. */
export function parentIsFree<P extends ParentView>(parent: P, choice: ParentChoice<P>): boolean {
  return parent.busyUntil <= choice.now && choice.uploading(parent) < parentPieceLimit(parent, choice.perParent, choice.hasNodeParents);
}

/**
 * Whether a piece on its way still occupies its parent's upload (`receivedBytes` undefined: the
 * parent has not begun to send it). One whose bytes are all in but the last, which a relaying
 * parent holds back until it has checked and stored its own copy, does not: in a chain, waiting
 * for that check and then the child's own before asking for the next piece would idle the link at
 * every piece and every hop.
 */
export function stillUploading(receivedBytes: number | undefined, pieceLength: number): boolean {
  return receivedBytes === undefined || receivedBytes < pieceLength - 1;
}

/**
 * Whether `a` is the better parent for piece `index` than `b`: one holding it whole before one
 * still receiving it, a node before a seed, then the least busy, then the fastest.
 */
export function betterParent(a: ParentView, b: ParentView, index: number): boolean {
  const whole = Number(a.holdsWhole(index)) - Number(b.holdsWhole(index));
  if (whole !== 0) return whole > 0;
  if (a.seed !== b.seed) return !a.seed;
  if (a.inflight !== b.inflight) return a.inflight < b.inflight;
  return a.rate > b.rate;
}

/** The parent to ask for piece `index` now (other than `except`), or undefined when no free parent offers it. */
export function bestParentFor<P extends ParentView>(
  index: number,
  parents: Iterable<P>,
  choice: ParentChoice<P>,
  except?: P,
): P | undefined {
  let best: P | undefined;
  for (const parent of parents) {
    if (parent === except || !parent.offers(index) || !parentIsFree(parent, choice)) continue;
    if (!best || betterParent(parent, best, index)) best = parent;
  }
  return best;
}
