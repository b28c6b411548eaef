import type { PieceRun } from '../../sources/piece-source.js';

/** Ascending piece indexes as contiguous runs, each to be read with one request. */
export function contiguousRuns(ascending: Iterable<number>): PieceRun[] {
  const runs: PieceRun[] = [];
  for (const index of ascending) {
    const last = runs[runs.length - 1];
    if (last && last.last === index - 1) last.last = index;
    else runs.push({ first: index, last: index });
  }
  return runs;
}

/**
 * The order to read runs of missing pieces from the origin: as given, except that the blob's
 * last piece, when it ends the last run, becomes a run of its own, read first. A lazy puller
 * reads an eStargz or zstd:chunked layer's footer and TOC, at its end, before any other byte;
 * a reader fetching the whole blob would otherwise bring it last. For a whole download the
 * order costs nothing.
 */
export function lastPieceFirst(runs: PieceRun[], pieceCount: number): PieceRun[] {
  const tail = runs[runs.length - 1];
  const lastPiece = pieceCount - 1;
  if (!tail || tail.last !== lastPiece || tail.first === lastPiece) return runs;
  return [{ first: lastPiece, last: lastPiece }, ...runs.slice(0, -1), { first: tail.first, last: lastPiece - 1 }];
}

/** The runs in which a download reads its missing pieces (ascending indexes) from the origin, each on a connection of its own. */
export function originRuns(missing: Iterable<number>, pieceCount: number): PieceRun[] {
  return lastPieceFirst(contiguousRuns(missing), pieceCount);
}
