// Who may be given a blob this peer holds (docs/security.md, "Who may read a cached blob"):
//
// - A blob a source registry serves to anyone may be given to anyone: they could fetch it there.
// - A private blob goes to a client only when the client names one of its source registries and
//   that registry accepts the client's credentials for it (a HEAD there; access-checker.ts). Never
//   the registry the client merely names: any registry can answer 200 to a HEAD.
// - A request naming another registry is a miss for that registry: its bytes come from there.
// - While a blob is being fetched, only the registry it is fetched for counts: the bytes on their
//   way are that registry's word until the whole blob verifies against its digest.
import type { BlobSource } from '../../storage/stored-blob.js';

export type Rule =
  /** Anyone may be given the blob. */
  | { kind: 'public' }
  /** The client may be given it if `source.registry` accepts its credentials. */
  | { kind: 'ask'; source: BlobSource }
  /** No source of this blob is the registry the client names: fetch from that registry instead. */
  | { kind: 'foreign' };

export function ruleFor(blob: { complete: boolean; sources: readonly BlobSource[] }, registry: string): Rule {
  const counted = blob.complete ? blob.sources : blob.sources.slice(0, 1);
  if (blob.complete && counted.some((source) => source.public)) return { kind: 'public' };
  const own = counted.find((source) => source.registry === registry);
  if (!own) return { kind: 'foreign' };
  return own.public ? { kind: 'public' } : { kind: 'ask', source: own };
}
