// Plots of emulated-cluster runs: the share of nodes done over time (one CDF per scenario, with T*)
// and the origin's egress rate over time (one panel per scenario), from the JSON that
// bench/direct-pull.ts, bench/swarm-cluster.ts and bench/bittorrent-baseline.ts write with --json-out;
// and, when the runs recorded each node's own bound, the share of nodes done within x times it
// (PREFIX-own-bound.svg, overall and per group of equal links).
//
//   npx tsx bench/plot-cluster.ts --out docs/img/emulated-32-nodes --title "32 nodes × 10 Mbit/s, 64 MiB" A.json B.json …
//
// A file may be given as FILE=LABEL to name its curve (two runs of one benchmark side by side).

import fs from 'node:fs';
import { parseArgs } from 'node:util';
import { writeBoundPlot, writeClusterPlots } from './lib/cluster-plots.js';
import { itemAt } from '../src/common/indexing.js';

interface ClusterResult {
  kind: string;
  lowerBound: { seconds: number };
  sizeBytes: number;
  perNode: Array<{ done: number; bound?: number; group?: string }>;
  egress?: { samples: Array<[number, number]>; bytes: number; peakBitsPerSecond: number };
}

type NodeResult = ClusterResult['perNode'][number];

function hasOwnBound(p: NodeResult): p is Required<NodeResult> {
  return p.bound !== undefined && p.group !== undefined;
}

const LABELS: Record<string, string> = {
  'direct-pull': '(a) direct pull',
  'starling-swarm': '(b) Starling swarm',
  bittorrent: 'BitTorrent (aria2)',
};

const { values, positionals } = parseArgs({
  options: { out: { type: 'string' }, title: { type: 'string', default: '' } },
  allowPositionals: true,
});
if (!values.out || positionals.length === 0) {
  console.error('usage: npx tsx bench/plot-cluster.ts --out PREFIX [--title TEXT] RESULT.json[=LABEL]...');
  process.exit(2);
}
const results = positionals.map((arg) => {
  const [file, name] = arg.split(/=(.*)/s) as [string, string | undefined];
  const result = JSON.parse(fs.readFileSync(file, 'utf8')) as ClusterResult & { label?: string };
  if (!Array.isArray(result.perNode) || !result.lowerBound)
    throw new Error(`${file}: not the JSON of a cluster benchmark (no perNode or lowerBound)`);
  if (!result.egress?.samples) throw new Error(`${file}: has no egress samples (written before --json-out recorded them?)`);
  return { ...result, egress: result.egress, label: name || undefined };
});
const label = (r: ClusterResult & { label?: string }) => r.label ?? LABELS[r.kind] ?? r.kind;
writeClusterPlots(
  values.out,
  `${values.title ? `${values.title}: ` : ''}share of nodes done (emulated cluster)`,
  results.map((r) => ({
    label: label(r),
    done: r.perNode.map((p) => p.done),
    egressSamples: r.egress.samples,
    egressTitle: `${label(r)}: origin egress, ${(r.egress.bytes / r.sizeBytes).toFixed(2)} copies`,
  })),
  [{ x: itemAt(results, 0).lowerBound.seconds, label: 'T*' }],
);
console.log(`wrote ${values.out}-cdf.svg and ${values.out}-egress.svg`);
// Runs written before each node's own bound was recorded have none: no plot of them.
const withBounds = results.map((r) => ({ label: label(r), perNode: r.perNode.filter(hasOwnBound) }));
if (withBounds.every((r, i) => r.perNode.length === itemAt(results, i).perNode.length)) {
  writeBoundPlot(values.out, `${values.title ? `${values.title}: ` : ''}nodes against their own bound (emulated cluster)`, withBounds);
  console.log(`wrote ${values.out}-own-bound.svg`);
}
