// Small helpers for reporting: medians, sizes and rates (parsing them: src/common/units.ts).

import { itemAt } from '../../src/common/indexing.js';

export function median(values: number[]): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? itemAt(sorted, mid) : (itemAt(sorted, mid - 1) + itemAt(sorted, mid)) / 2;
}

export function mb(bytes: number): string {
  return (bytes / 1e6).toFixed(0);
}

export function mbps(bytesPerSecond: number): string {
  return (bytesPerSecond / 1e6).toFixed(0);
}

export function fixed(value: number, digits = 2): string {
  return Number.isFinite(value) ? value.toFixed(digits) : 'n/a';
}

/** A plain-text table with right-aligned columns after the first. */
export function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(itemAt(widths, i)) : c.padStart(itemAt(widths, i)))).join('  ');
  return [line(header), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(line)].join('\n');
}
