/** How a blob is cut into pieces: the unit that is fetched, verified, stored and shared. */

export const MIN_PIECE_SIZE = 4 * 1024 * 1024;
export const MAX_PIECE_SIZE = 64 * 1024 * 1024;
/** Aim for at most this many pieces per blob, so that piece metadata stays small. */
const TARGET_MAX_PIECES = 1024;

/** Picks the piece size for a blob: 4 MiB up to 4 GiB blobs, then powers of two up to 64 MiB. */
export function pieceSizeFor(blobSize: number): number {
  let size = MIN_PIECE_SIZE;
  while (size < MAX_PIECE_SIZE && blobSize > size * TARGET_MAX_PIECES) size *= 2;
  return size;
}

export interface PieceLayout {
  size: number;
  pieceSize: number;
  pieceCount: number;
}

export function pieceLayout(size: number, pieceSize = pieceSizeFor(size)): PieceLayout {
  return { size, pieceSize, pieceCount: Math.max(1, Math.ceil(size / pieceSize)) };
}

/** Byte offset and length of piece `index`. A zero-byte blob has one empty piece. */
export function pieceBounds(layout: PieceLayout, index: number): { offset: number; length: number } {
  const offset = index * layout.pieceSize;
  return { offset, length: Math.max(0, Math.min(layout.pieceSize, layout.size - offset)) };
}

/** Indexes of the first and last piece that hold bytes [start, end] (inclusive). */
export function piecesCovering(layout: PieceLayout, start: number, end: number): { first: number; last: number } {
  return { first: Math.floor(start / layout.pieceSize), last: Math.floor(end / layout.pieceSize) };
}
