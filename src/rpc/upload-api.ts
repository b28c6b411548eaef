/**
 * The contract of a peer's upload port (peer/upload/server.ts), shared by its callers: children
 * fetching pieces and bitmaps, the scheduler triggering a seed, the manager sending preheats.
 * Every request carries the cluster token; pieces of a private blob also need the proof below.
 * Bodies are validated where they are received, with the schemas here.
 */
import { z } from 'zod';
import { countField, digestField } from './wire.js';

/** `GET`: one piece's bytes. */
export const PIECE_PATH = /^\/_starling\/pieces\/(sha256:[0-9a-f]{64})\/(\d+)$/;
/** `GET ?known=<version>&wait=<ms>`: which pieces are held, long-polled. */
export const BITMAP_PATH = /^\/_starling\/tasks\/(sha256:[0-9a-f]{64})\/pieces$/;
/** `POST` a BlobFetchRequest (scheduler/seed-trigger.ts): a seed fetches a public blob from its origin. */
export const SEED_TRIGGER_PATH = '/_starling/seed';
/** `POST` a BlobFetchRequest from the manager: fetch a blob through the swarm ahead of need. */
export const PREHEAT_PATH = '/_starling/preheat';
/** `GET`: how a preheat (or seed) fetch is doing, as a FetchStatus. */
export const PREHEAT_STATUS_PATH = /^\/_starling\/preheat\/(sha256:[0-9a-f]{64})$/;

export const piecePath = (digest: string, index: number): string => `/_starling/pieces/${digest}/${index}`;

/**
 * `GET ?hops=<n>`: bytes [start, end] of one piece (offsets within the piece, end included), for
 * a lazy reader that needs only part of a piece it does not hold: its parent answers from the
 * piece, from a span it keeps, or by reading the span from its own parent or the origin. Span
 * bytes are not checked against the piece digest (the piece is not whole): only clients that
 * check what they read against a verified eStargz TOC are given them (READ_CHECKED_HEADER).
 */
export const SPAN_PATH = /^\/_starling\/pieces\/(sha256:[0-9a-f]{64})\/(\d+)\/bytes\/(\d+)-(\d+)$/;

/** Part of one piece: offsets within the piece, `end` included. */
export interface PieceSpan {
  start: number;
  end: number;
}

/** A span passes through at most this many peers on its way from the origin (a guard against a cycle of parents). */
export const MAX_SPAN_HOPS = 64;

/** The path of a span request; `hops`: peers the request has already passed through. */
export function spanRequestPath(digest: string, index: number, span: PieceSpan, hops: number): string {
  return `${piecePath(digest, index)}/bytes/${span.start}-${span.end}?hops=${hops}`;
}

/** What a child says of a piece it asks for; only a parent fetching pieces on demand (a triggered seed) heeds it. */
export interface PieceWish {
  /** `?whole`: the child wants every piece it lacks, so the seed reads the rest of the blob at once. */
  wholeBlob: boolean;
  /** `?background`: only a background reader waits for the piece, so it comes after the reads workloads wait for. */
  background: boolean;
}

/** A piece request's path with the child's wish in its query. */
export function pieceRequestPath(digest: string, index: number, wish: PieceWish): string {
  const query = [wish.wholeBlob ? 'whole' : '', wish.background ? 'background' : ''].filter(Boolean).join('&');
  return `${piecePath(digest, index)}${query ? `?${query}` : ''}`;
}

/** The wish a piece request's query carries (flags it does not know are ignored). */
export function pieceWish(query: URLSearchParams): PieceWish {
  return { wholeBlob: query.has('whole'), background: query.has('background') };
}
export const bitmapPath = (digest: string): string => `/_starling/tasks/${digest}/pieces`;
export const preheatStatusPath = (digest: string): string => `${PREHEAT_PATH}/${digest}`;

/**
 * The body of a seed trigger and of a preheat: fetch the whole blob `taskId` from `origin`, cut
 * into pieces of `pieceSize` (which must be the size the peer's plan gives `contentLength`).
 * Strict: an unknown field is an error that names it, as a misspelt one would otherwise be lost.
 */
export const blobFetchRequestSchema = z
  .object({
    taskId: digestField,
    contentLength: countField,
    pieceSize: z.number().int().positive(),
    origin: z
      .object({
        url: z.url({ protocol: /^https?$/, error: 'must be an http(s) URL' }),
        /** Sent to the origin with each request (a registry's Authorization); only over TLS. */
        headers: z.record(z.string(), z.string()).default({}),
      })
      .strict(),
  })
  .strict();
export type BlobFetchRequest = z.output<typeof blobFetchRequestSchema>;

/** The answer to `GET /_starling/preheat/<digest>`. */
export const fetchStatusSchema = z.object({
  digest: digestField,
  size: countField,
  storedBytes: countField,
  complete: z.boolean(),
  /** Why the fetch failed, when it did. */
  error: z.string().optional(),
});
export type FetchStatus = z.output<typeof fetchStatusSchema>;

/**
 * Sent with a piece request: the registry blob URL the child's client asked for. A parent gives
 * pieces of a private blob only to a child whose client's registry is a source of the blob and
 * accepts that client's credentials (peer/access/rule.ts).
 */
export const CLIENT_ORIGIN_HEADER = 'x-starling-origin';
/** Sent with a piece request of a private blob, over TLS only: the child's client's Authorization. */
export const CLIENT_AUTHORIZATION_HEADER = 'x-starling-registry-authorization';
