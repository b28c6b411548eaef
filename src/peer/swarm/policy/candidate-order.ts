/**
 * Which wanted piece a peer asks its parents for first. Pieces other nodes hold come before
 * pieces only seeds hold (a seed's upload is the swarm's scarcest resource: it should send each
 * piece about once and let the nodes trade), then rarest first, then a random rank fixed per
 * download. While a client streams the blob from its start, the next couple of pieces it needs
 * come before all of them. A lazy reader's pieces that a workload waits for come before the rest,
 * in index order (see orderCandidates).
 */

/**
 * Pieces at the head of the blob fetched first while a client streams it. Only a couple: when
 * every peer streams, a wide head window has them all ask for the same pieces.
 */
export const HEAD_WINDOW = 2;

/**
 * Holder counts above this rank alike. The scheduler names at most 50 candidate parents, so no
 * piece reaches it; the bound lets a rarity class index a fixed array (the simulator's buckets).
 */
export const MAX_RANKED_HOLDERS = 63;

/** How many rarity classes there are: seed-only or not, times 0..MAX_RANKED_HOLDERS holders. */
export const RARITY_CLASSES = 2 * (MAX_RANKED_HOLDERS + 1);

/** A wanted piece that can be fetched now: its digest is vouched for and some parent offers it. */
export interface Candidate {
  index: number;
  /** Parents offering it (holding it, or receiving it and relaying it as it arrives). */
  holders: number;
  /** Those of them that are nodes, not seeds. */
  nodeHolders: number;
  /** A workload waits for it, and the peer reads the blob lazily (not a download of the whole blob). */
  awaited?: boolean;
  /** Some parent holds it or is receiving it now, rather than fetching it only when asked. */
  carried?: boolean;
}

/** A piece's rarity class, lower first: pieces some node offers, then seed-only ones; fewer holders first within each. */
export function rarityClass(holders: number, nodeHolders: number): number {
  const seedOnly = nodeHolders === 0 ? 1 : 0;
  return seedOnly * (MAX_RANKED_HOLDERS + 1) + Math.min(holders, MAX_RANKED_HOLDERS);
}

/**
 * A random rank per piece, fixed for one download: among equally rare pieces each peer starts
 * somewhere else, so a seed sends different pieces to different children (which can then trade
 * them) instead of the same first pieces to everyone.
 */
export function pieceTieBreaks(pieceCount: number, random: () => number = Math.random): Float64Array {
  return Float64Array.from({ length: pieceCount }, () => random());
}

/**
 * The candidates' indexes, best first. `tieBreak` is the download's rank of a piece (pieceTieBreaks).
 *
 * A lazy reader's awaited pieces come first: those a parent holds or receives now (they come at
 * once), then the others, each in index order, the same on every node. In a chain a child then asks
 * its parent for the piece the parent is receiving, and gets it relayed as it arrives. With the
 * random rank, a child asked for a piece its parent would fetch only later: 8 nodes mounting a
 * 4-layer image waited 2-4 s for each hop's first byte (bench/e2e-cluster.ts, peers at debug: the
 * 'piece asked' lines). Whole downloads keep the random rank, which spreads the pieces a seed sends.
 */
export function orderCandidates(candidates: readonly Candidate[], tieBreak: (index: number) => number, streaming: boolean): number[] {
  const head = streaming ? [...candidates].sort((a, b) => a.index - b.index).slice(0, HEAD_WINDOW) : [];
  const rest = candidates.filter((c) => !head.includes(c));
  const awaited = rest.filter((c) => c.awaited === true);
  awaited.sort((a, b) => Number(b.carried === true) - Number(a.carried === true) || a.index - b.index);
  const others = rest.filter((c) => c.awaited !== true);
  others.sort(
    (a, b) => rarityClass(a.holders, a.nodeHolders) - rarityClass(b.holders, b.nodeHolders) || tieBreak(a.index) - tieBreak(b.index),
  );
  return [...head, ...awaited, ...others].map((c) => c.index);
}
