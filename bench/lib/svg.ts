// A small SVG line-chart writer for the simulator's plots (no dependencies).

import { itemAt } from '../../src/common/indexing.js';

export interface Series {
  label: string;
  /** Points in data coordinates, drawn in order. */
  points: Array<[number, number]>;
  /** Draw as a step function (each y holds until the next x). */
  step?: boolean;
  dashed?: boolean;
}

export interface ChartOptions {
  title: string;
  xLabel: string;
  yLabel: string;
  series: Series[];
  width?: number;
  height?: number;
  xMin?: number;
  xMax?: number;
  yMin?: number;
  yMax?: number;
  /** Vertical reference lines (e.g. T*). */
  markers?: Array<{ x: number; label: string }>;
  logX?: boolean;
}

const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf'];

function escape(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

/** 1, 2 or 5 × a power of ten: a step giving about `count` ticks over `span`. */
export function niceStep(span: number, count = 6): number {
  if (!(span > 0)) return 1;
  const raw = span / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (m * power >= raw) return m * power;
  return 10 * power;
}

function formatTick(value: number): string {
  if (value === 0) return '0';
  const abs = Math.abs(value);
  if (abs >= 1e6 || abs < 1e-3) return value.toExponential(0);
  return String(+value.toPrecision(6));
}

export function lineChart(options: ChartOptions): string {
  const width = options.width ?? 820;
  const height = options.height ?? 420;
  // The legend sits to the right of the plot, where it hides no line.
  const legendWidth = options.series.length > 1 ? 190 : 20;
  const margin = { left: 70, right: legendWidth, top: 40, bottom: 55 };
  const plotW = width - margin.left - margin.right;
  const plotH = height - margin.top - margin.bottom;
  const xs = options.series.flatMap((s) => s.points.map((p) => p[0]));
  const ys = options.series.flatMap((s) => s.points.map((p) => p[1]));
  const logX = options.logX ?? false;
  let xMin = options.xMin ?? Math.min(...xs, ...(options.markers ?? []).map((m) => m.x));
  let xMax = options.xMax ?? Math.max(...xs, ...(options.markers ?? []).map((m) => m.x));
  if (!Number.isFinite(xMin) || !Number.isFinite(xMax)) [xMin, xMax] = [0, 1];
  if (xMax === xMin) xMax = xMin + 1;
  const yMin = options.yMin ?? Math.min(0, ...ys);
  let yMax = options.yMax ?? Math.max(...ys);
  if (!Number.isFinite(yMax) || yMax === yMin) yMax = yMin + 1;
  const lx = (x: number) => (logX ? Math.log10(Math.max(x, 1e-12)) : x);
  const sx = (x: number) => margin.left + ((lx(x) - lx(xMin)) / (lx(xMax) - lx(xMin))) * plotW;
  const sy = (y: number) => margin.top + plotH - ((y - yMin) / (yMax - yMin)) * plotH;
  const out: string[] = [];
  out.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="12">`,
  );
  out.push(`<rect width="${width}" height="${height}" fill="white"/>`);
  out.push(`<text x="${width / 2}" y="22" text-anchor="middle" font-size="14" font-weight="bold">${escape(options.title)}</text>`);
  // axes and grid
  const yStep = niceStep(yMax - yMin, 5);
  for (let y = Math.ceil(yMin / yStep) * yStep; y <= yMax + 1e-9 * yStep; y += yStep) {
    const py = sy(y).toFixed(1);
    out.push(`<line x1="${margin.left}" y1="${py}" x2="${margin.left + plotW}" y2="${py}" stroke="#e5e5e5"/>`);
    out.push(`<text x="${margin.left - 6}" y="${py}" text-anchor="end" dominant-baseline="middle">${formatTick(y)}</text>`);
  }
  const xTicks: number[] = [];
  if (logX) {
    for (let e = Math.floor(Math.log10(xMin)); e <= Math.ceil(Math.log10(xMax)); e++) {
      for (const m of [1, 2, 5]) {
        const x = m * 10 ** e;
        if (x >= xMin && x <= xMax) xTicks.push(x);
      }
    }
  } else {
    const xStep = niceStep(xMax - xMin, 8);
    for (let x = Math.ceil(xMin / xStep) * xStep; x <= xMax + 1e-9 * xStep; x += xStep) xTicks.push(x);
  }
  for (const x of xTicks) {
    const px = sx(x).toFixed(1);
    out.push(`<line x1="${px}" y1="${margin.top}" x2="${px}" y2="${margin.top + plotH}" stroke="#e5e5e5"/>`);
    out.push(`<text x="${px}" y="${margin.top + plotH + 16}" text-anchor="middle">${formatTick(x)}</text>`);
  }
  out.push(`<rect x="${margin.left}" y="${margin.top}" width="${plotW}" height="${plotH}" fill="none" stroke="#333"/>`);
  out.push(`<text x="${margin.left + plotW / 2}" y="${height - 12}" text-anchor="middle">${escape(options.xLabel)}</text>`);
  out.push(`<text transform="translate(16 ${margin.top + plotH / 2}) rotate(-90)" text-anchor="middle">${escape(options.yLabel)}</text>`);
  for (const marker of options.markers ?? []) {
    if (marker.x < xMin || marker.x > xMax) continue;
    const px = sx(marker.x).toFixed(1);
    out.push(`<line x1="${px}" y1="${margin.top}" x2="${px}" y2="${margin.top + plotH}" stroke="#555" stroke-dasharray="2 3"/>`);
    out.push(`<text x="${px}" y="${margin.top - 4}" text-anchor="middle" font-size="11">${escape(marker.label)}</text>`);
  }
  // series
  options.series.forEach((series, i) => {
    const color = itemAt(COLORS, i % COLORS.length);
    const coords: string[] = [];
    let previous: [number, number] | undefined;
    for (const point of series.points) {
      const x = Math.min(Math.max(point[0], xMin), xMax);
      if (series.step && previous) coords.push(`${sx(x).toFixed(1)},${sy(previous[1]).toFixed(1)}`);
      coords.push(`${sx(x).toFixed(1)},${sy(point[1]).toFixed(1)}`);
      previous = [x, point[1]];
    }
    if (coords.length) {
      out.push(
        `<polyline fill="none" stroke="${color}" stroke-width="1.8"${series.dashed ? ' stroke-dasharray="6 4"' : ''} points="${coords.join(' ')}"/>`,
      );
    }
    if (options.series.length <= 1) return;
    const ly = margin.top + 10 + i * 18;
    const lx0 = margin.left + plotW + 12;
    out.push(
      `<line x1="${lx0}" y1="${ly}" x2="${lx0 + 22}" y2="${ly}" stroke="${color}" stroke-width="2"${series.dashed ? ' stroke-dasharray="6 4"' : ''}/>`,
    );
    out.push(`<text x="${lx0 + 28}" y="${ly}" dominant-baseline="middle">${escape(series.label)}</text>`);
  });
  out.push('</svg>');
  return out.join('\n') + '\n';
}

/** Several charts stacked vertically in one SVG. */
export function stackedCharts(charts: ChartOptions[]): string {
  const width = Math.max(...charts.map((c) => c.width ?? 820));
  let y = 0;
  const parts: string[] = [];
  for (const chart of charts) {
    const height = chart.height ?? 420;
    parts.push(lineChart(chart).replace('<svg ', `<svg x="0" y="${y}" `));
    y += height;
  }
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${y}" viewBox="0 0 ${width} ${y}">\n${parts.join('')}</svg>\n`;
}

/** The empirical CDF of `values` as step points: (x, fraction ≤ x). */
export function cdfPoints(values: number[]): Array<[number, number]> {
  const sorted = values.filter((v) => Number.isFinite(v)).sort((a, b) => a - b);
  const points: Array<[number, number]> = [];
  if (!sorted.length) return points;
  points.push([itemAt(sorted, 0), 0]);
  sorted.forEach((v, i) => points.push([v, (i + 1) / sorted.length]));
  return points;
}
