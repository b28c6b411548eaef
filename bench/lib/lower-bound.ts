// The lower bound every swarm benchmark and the simulator measure against.

export interface LowerBoundInput {
  /** Blob size in bytes. */
  F: number;
  /** Source (origin / seed) upload, bytes per second. */
  us: number;
  /** Upload of each of the N receiving peers, bytes per second. */
  ui: number[];
  /** Slowest receiver's download, bytes per second. */
  dmin: number;
}

export interface LowerBound {
  /** T* in seconds. */
  seconds: number;
  /** Which term binds: the source's upload, the slowest download, or the aggregate upload. */
  binding: 'source' | 'download' | 'aggregate';
  terms: { source: number; download: number; aggregate: number };
}

/**
 * Kumar & Ross (2006): the minimum time to get a file of F bytes from one source to all N
 * peers, T* = max(F/u_s, F/d_min, N·F/(u_s + Σu_i)). Any consistent units: here bytes and
 * bytes/s (tc's rates are bits per second: divide by 8).
 */
export function lowerBound({ F, us, ui, dmin }: LowerBoundInput): LowerBound {
  const N = ui.length;
  const terms = {
    source: F / us,
    download: F / dmin,
    aggregate: (N * F) / (us + ui.reduce((a, b) => a + b, 0)),
  };
  let binding: LowerBound['binding'] = 'source';
  if (terms.download > terms[binding]) binding = 'download';
  if (terms.aggregate > terms[binding]) binding = 'aggregate';
  return { seconds: terms[binding], binding, terms };
}
