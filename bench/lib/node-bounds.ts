// Each node's own lower bound, and how close each node came to it.
//
// T* (Kumar & Ross) is the bound for the LAST node, and F/d_min makes the slowest node set it: a
// run where fast nodes wait on slow ones still scores well on last/T*. A node's own bound
//
//   b_i = max(F/d_i, F/u_s, N·F/(u_s + Σu_j))
//
// replaces d_min by the node's own download. With links that change during the run, F/d_i is the
// time to receive F at the node's download over time, and the aggregate term the time for the
// source and every node together to upload N·F.

import { median } from './stats.js';
import type { NodeLink } from './link-plan.js';
import { itemAt } from '../../src/common/indexing.js';

/** Seconds until `bytes` have moved at a rate (bytes/s) that is `rate` from each step's `at` on. */
export function timeToMove(bytes: number, steps: Array<{ at: number; rate: number }>): number {
  let moved = 0;
  for (let i = 0; i < steps.length; i++) {
    const { at, rate } = itemAt(steps, i);
    const end = steps[i + 1]?.at ?? Infinity;
    if (rate > 0 && moved + rate * (end - at) >= bytes) return at + (bytes - moved) / rate;
    moved += rate * (end - at);
  }
  return Infinity;
}

export interface NodeBound {
  seconds: number;
  binding: 'download' | 'source' | 'aggregate';
  terms: { download: number; source: number; aggregate: number };
}

/**
 * b_i for every node: F bytes from a source uploading `sourceUp` bits/s to nodes linked as
 * `links` (bits/s, possibly changing over time).
 */
export function nodeBounds(F: number, sourceUp: number, links: NodeLink[]): NodeBound[] {
  const N = links.length;
  // The aggregate upload over time: the source plus every node's upload at each change.
  const moments = [...new Set(links.flatMap((l) => l.steps.map((s) => s.at)))].sort((a, b) => a - b);
  const upAt = (link: NodeLink, t: number) => {
    let up = link.steps[0].up;
    for (const s of link.steps) if (s.at <= t) up = s.up;
    return up;
  };
  const aggregate = timeToMove(
    N * F,
    moments.map((at) => ({ at, rate: (sourceUp + links.reduce((sum, l) => sum + upAt(l, at), 0)) / 8 })),
  );
  const source = F / (sourceUp / 8);
  return links.map((link) => {
    const terms = {
      download: timeToMove(
        F,
        link.steps.map((s) => ({ at: s.at, rate: s.down / 8 })),
      ),
      source,
      aggregate,
    };
    let binding: NodeBound['binding'] = 'download';
    if (terms.source > terms[binding]) binding = 'source';
    if (terms.aggregate > terms[binding]) binding = 'aggregate';
    return { seconds: terms[binding], binding, terms };
  });
}

export interface RatioStats {
  nodes: number;
  median: number;
  worst: number;
  worstNode: string;
}

export interface BoundRatios {
  overall: RatioStats;
  /** One entry per group of equal links, in the order groups first appear. */
  groups: Array<RatioStats & { group: string }>;
}

/** Median and worst of done_i / b_i, over all nodes and per group of equal links. */
export function boundRatios(nodes: Array<{ node: string; done: number; bound: number; group: string }>): BoundRatios {
  const stats = (list: typeof nodes): RatioStats => {
    const ratios = list.map((n) => n.done / n.bound);
    let worst = 0;
    for (let i = 1; i < ratios.length; i++) if (itemAt(ratios, i) > itemAt(ratios, worst)) worst = i;
    return { nodes: list.length, median: median(ratios), worst: ratios[worst] ?? NaN, worstNode: list[worst]?.node ?? '' };
  };
  const byGroup = new Map<string, typeof nodes>();
  for (const n of nodes) byGroup.set(n.group, [...(byGroup.get(n.group) ?? []), n]);
  return { overall: stats(nodes), groups: [...byGroup].map(([group, list]) => ({ group, ...stats(list) })) };
}

/** Lines for a report: each node against its own bound, overall and per group. */
export function boundRatioLines(r: BoundRatios): string[] {
  const f = (x: number) => (Number.isFinite(x) ? x.toFixed(2) : 'n/a');
  const lines = [
    `done / own bound: median ${f(r.overall.median)}, worst ${f(r.overall.worst)} (${r.overall.worstNode}) over ${r.overall.nodes} nodes`,
  ];
  if (r.groups.length > 1) {
    for (const g of r.groups) lines.push(`  ${g.group} (${g.nodes} nodes): median ${f(g.median)}, worst ${f(g.worst)} (${g.worstNode})`);
  }
  return lines;
}
