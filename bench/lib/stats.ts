// Small helpers for reporting: medians, sizes and rates.

export function median(values: number[]): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

const UNITS: Record<string, number> = {
  '': 1, b: 1,
  k: 1e3, kb: 1e3, m: 1e6, mb: 1e6, g: 1e9, gb: 1e9,
  kib: 2 ** 10, mib: 2 ** 20, gib: 2 ** 30,
};

/** "1GB" → 1e9, "512MiB" → 536870912, "1000000" → 1e6. */
export function parseSize(text: string): number {
  const match = /^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$/i.exec(text);
  const unit = match ? UNITS[match[2]!.toLowerCase()] : undefined;
  if (!match || unit === undefined) throw new Error(`cannot read size "${text}" (examples: 1GB, 512MiB, 100000000)`);
  return Math.round(Number(match[1]) * unit);
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
  const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  return [line(header), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(line)].join('\n');
}
