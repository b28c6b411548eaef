// Plots of emulated-cluster runs: the share of nodes done over time (one CDF per scenario, with T*)
// and the origin's egress rate over time (one panel per scenario), from the JSON that
// bench/direct-pull.ts, bench/swarm-cluster.ts and bench/bittorrent-baseline.ts write with --json-out.
//
//   npx tsx bench/plot-cluster.ts --out docs/img/emulated-32-nodes --title "32 nodes × 10 Mbit/s, 64 MiB" A.json B.json …

import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { cdfPoints, lineChart, stackedCharts, type Series } from '../sim/svg.js';
import { egressRateSteps } from './lib/egress.js';

interface ClusterResult {
  kind: string;
  lowerBound: { seconds: number };
  lastSeconds: number;
  sizeBytes: number;
  perNode: Array<{ done: number }>;
  egress?: { samples: Array<[number, number]>; bytes: number; peakBitsPerSecond: number };
}

const LABELS: Record<string, string> = {
  'direct-pull': '(a) direct pull',
  'starling-swarm': '(b) Starling swarm',
  bittorrent: 'BitTorrent (aria2)',
};

const { values, positionals } = parseArgs({ options: { out: { type: 'string' }, title: { type: 'string', default: '' } }, allowPositionals: true });
if (!values.out || positionals.length === 0) {
  console.error('usage: npx tsx bench/plot-cluster.ts --out PREFIX [--title TEXT] RESULT.json...');
  process.exit(2);
}
const results = positionals.map((file) => {
  const result = JSON.parse(fs.readFileSync(file, 'utf8')) as ClusterResult;
  if (!Array.isArray(result.perNode) || !result.lowerBound) throw new Error(`${file}: not the JSON of a cluster benchmark (no perNode or lowerBound)`);
  if (!result.egress?.samples) throw new Error(`${file}: has no egress samples (written before --json-out recorded them?)`);
  return result;
});
const label = (r: ClusterResult) => LABELS[r.kind] ?? r.kind;
const title = values.title ? `${values.title}: ` : '';
const T = results[0]!.lowerBound.seconds;
const hi = Math.max(...results.map((r) => r.lastSeconds));
fs.mkdirSync(path.dirname(values.out), { recursive: true });

const cdf: Series[] = results.map((r) => ({ label: label(r), points: cdfPoints(r.perNode.map((p) => p.done)), step: true }));
fs.writeFileSync(
  `${values.out}-cdf.svg`,
  lineChart({
    title: `${title}share of nodes done (emulated cluster)`,
    xLabel: 'seconds from the start',
    yLabel: 'share of nodes done',
    series: cdf,
    yMin: 0,
    yMax: 1,
    xMin: 0,
    xMax: hi * 1.05,
    markers: [{ x: T, label: 'T*' }],
  }),
);
fs.writeFileSync(
  `${values.out}-egress.svg`,
  stackedCharts(
    results.map((r) => {
      const points = egressRateSteps(r.egress!.samples);
      return {
        title: `${label(r)}: origin egress, ${(r.egress!.bytes / r.sizeBytes).toFixed(2)} copies`,
        xLabel: 'seconds from the start',
        yLabel: 'Mbit/s',
        series: [{ label: label(r), points, step: true }],
        yMin: 0,
        yMax: Math.max(1, ...points.map((p) => p[1])) * 1.1,
        xMin: 0,
        xMax: hi * 1.02,
        height: 240,
      };
    }),
  ),
);
console.log(`wrote ${values.out}-cdf.svg and ${values.out}-egress.svg`);
