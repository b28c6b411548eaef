/**
 * The contract of a peer's upload port (peer/upload/server.ts), shared by its callers: children
 * fetching pieces and bitmaps, the scheduler triggering a seed, the manager sending preheats.
 * Every request carries the cluster token; pieces of a private blob also need the proof below.
 */

/** `GET`: one piece's bytes. */
export const PIECE_PATH = /^\/_starling\/pieces\/(sha256:[0-9a-f]{64})\/(\d+)$/;
/** `GET ?known=<version>&wait=<ms>`: which pieces are held, long-polled. */
export const BITMAP_PATH = /^\/_starling\/tasks\/(sha256:[0-9a-f]{64})\/pieces$/;
/** `POST` a seed request (scheduler/seed-trigger.ts): fetch a public blob from its origin. */
export const SEED_TRIGGER_PATH = '/_starling/seed';
/** `POST` a preheat request from the manager. */
export const PREHEAT_PATH = '/_starling/preheat';
/** `GET`: how a preheat (or seed) fetch is doing. */
export const PREHEAT_STATUS_PATH = /^\/_starling\/preheat\/(sha256:[0-9a-f]{64})$/;

export const piecePath = (digest: string, index: number): string => `/_starling/pieces/${digest}/${index}`;
export const bitmapPath = (digest: string): string => `/_starling/tasks/${digest}/pieces`;

/**
 * Sent with a piece request: the registry blob URL the child's client asked for. A parent gives
 * pieces of a private blob only to a child whose client's registry is a source of the blob and
 * accepts that client's credentials (peer/access/rule.ts).
 */
export const CLIENT_ORIGIN_HEADER = 'x-starling-origin';
/** Sent with a piece request of a private blob, over TLS only: the child's client's Authorization. */
export const CLIENT_AUTHORIZATION_HEADER = 'x-starling-registry-authorization';
