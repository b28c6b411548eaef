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
export function writeClusterPlots(
  prefix: string,
  cdfTitle: string,
  runs: PlottedRun[],
  markers: Array<{ x: number; label: string }>,
): void {
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

/** One run's nodes against their own bounds (bench/lib/node-bounds.ts): done_i / b_i per node, by group of equal links. */
export interface BoundRun {
  label: string;
  perNode: Array<{ done: number; bound: number; group: string }>;
}

/**
 * Writes `${prefix}-own-bound.svg`: for each run, the share of nodes done within x times their own
 * bound, all nodes (solid) and, when the run has several groups of links, each group (dashed), with
 * the issue's goals (1.3 for the fast nodes' median, 1.5 for every node) as reference lines.
 */
export function writeBoundPlot(prefix: string, title: string, runs: BoundRun[]): void {
  fs.mkdirSync(path.dirname(prefix), { recursive: true });
  const series = runs.flatMap((run) => {
    const all = { label: run.label, points: cdfPoints(run.perNode.map((n) => n.done / n.bound)), step: true };
    const groups = [...new Set(run.perNode.map((n) => n.group))];
    if (groups.length < 2) return [all];
    return [
      all,
      ...groups.map((group) => ({
        label: `${run.label}: ${group}`,
        points: cdfPoints(run.perNode.filter((n) => n.group === group).map((n) => n.done / n.bound)),
        step: true,
        dashed: true,
      })),
    ];
  });
  const worst = Math.max(...runs.flatMap((r) => r.perNode.map((n) => n.done / n.bound)));
  fs.writeFileSync(
    `${prefix}-own-bound.svg`,
    lineChart({
      title,
      xLabel: "node's completion / its own bound b_i",
      yLabel: 'share of nodes',
      series,
      xMin: 1,
      xMax: Math.max(1.6, worst * 1.05),
      yMin: 0,
      yMax: 1,
      markers: [
        { x: 1.3, label: '1.3' },
        { x: 1.5, label: '1.5' },
      ],
    }),
  );
}
