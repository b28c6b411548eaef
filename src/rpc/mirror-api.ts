/**
 * What a client of the peer mirror may add to the OCI distribution API: how urgent a ranged read
 * is. The snapshotter marks the reads of its background fetch (the rest of a lazily mounted
 * layer, after its workload started); the peer passes the mark on to the seeds it reads through,
 * which put such pieces after every read a workload is waiting for.
 */

/** A read a workload waits for (`demand`, the default), or one that fills a cache (`background`). */
export type ReadPriority = 'demand' | 'background';

/** Request header on a blob GET with a Range: `background` marks a background read. */
export const READ_PRIORITY_HEADER = 'x-starling-priority';

/** The priority a request's header names; anything but `background` (or no header) is `demand`. */
export function readPriority(header: string | string[] | undefined): ReadPriority {
  return header === 'background' ? 'background' : 'demand';
}

/**
 * Request header on a ranged blob GET: `toc` says the client checks every byte it reads against a
 * TOC whose digest it verified (a lazily mounted eStargz layer). The peer may then answer the
 * part of a piece the range needs as a span from its parents (upload-api.ts SPAN_PATH), before
 * that piece is whole and checked, rather than fetch the whole piece: a lazy start then moves
 * the bytes it reads, not the 4 MiB pieces around them. Other clients get checked pieces only.
 */
export const READ_CHECKED_HEADER = 'x-starling-checked';

/** Whether a request's header says its client checks what it reads against a verified TOC. */
export function checksAgainstToc(header: string | string[] | undefined): boolean {
  return header === 'toc';
}
