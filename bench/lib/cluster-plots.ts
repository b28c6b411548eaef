// The two plots of an emulated-cluster comparison: the share of nodes done over time (one CDF per
// run, with reference lines such as T*) and the origin's egress rate over time (one panel per
// run). Drawn by bench/plot-cluster.ts from saved results and by bench/swarm-lazy.ts after a run.
import fs from 'node:fs';
import path from 'node:path';
import { cdfPoints, lineChart, stackedCharts } from './svg.js';
import { egressRateSteps } from './egress.js';

export interface PlottedRun {
  label: string;
  /** Seconds from the start at which each node was done. */
  done: number[];
  /** The origin's egress samples (bench/lib/egress.ts). */
  egressSamples: Array<[number, number]>;
  /** Title of this run's egress panel. */
  egressTitle: string;
}

/** Writes `${prefix}-cdf.svg` and `${prefix}-egress.svg`. */
export function writeClusterPlots(prefix: string, cdfTitle: string, runs: PlottedRun[], markers: Array<{ x: number; label: string }>): void {
  fs.mkdirSync(path.dirname(prefix), { recursive: true });
  const end = Math.max(...runs.flatMap((r) => [...r.done, ...r.egressSamples.map((s) => s[0])]));
  fs.writeFileSync(
    `${prefix}-cdf.svg`,
    lineChart({
      title: cdfTitle,
      xLabel: 'seconds from the start',
      yLabel: 'share of nodes done',
      series: runs.map((r) => ({ label: r.label, points: cdfPoints(r.done), step: true })),
      yMin: 0,
      yMax: 1,
      xMin: 0,
      xMax: Math.max(...runs.flatMap((r) => r.done)) * 1.05,
      markers,
    }),
  );
  fs.writeFileSync(
    `${prefix}-egress.svg`,
    stackedCharts(
      runs.map((r) => {
        const points = egressRateSteps(r.egressSamples);
        return {
          title: r.egressTitle,
          xLabel: 'seconds from the start',
          yLabel: 'Mbit/s',
          series: [{ label: r.label, points, step: true }],
          yMin: 0,
          yMax: Math.max(1, ...points.map((p) => p[1])) * 1.1,
          xMin: 0,
          xMax: end * 1.02,
          height: 250,
        };
      }),
    ),
  );
}
