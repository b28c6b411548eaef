import { itemAt } from './indexing.js';

const SIZE_UNITS: Record<string, number> = {
  '': 1, b: 1,
  k: 1e3, kb: 1e3, m: 1e6, mb: 1e6, g: 1e9, gb: 1e9, t: 1e12, tb: 1e12,
  ki: 2 ** 10, kib: 2 ** 10, mi: 2 ** 20, mib: 2 ** 20, gi: 2 ** 30, gib: 2 ** 30, ti: 2 ** 40, tib: 2 ** 40,
};

/** Parses "4MiB", "1.5GB", "1048576" into bytes. Throws a message naming the bad value. */
export function parseSize(value: string | number): number {
  if (typeof value === 'number') {
    if (!Number.isFinite(value) || value < 0) throw new Error(`invalid size ${value}`);
    return Math.floor(value);
  }
  const match = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(value);
  const unit = match ? SIZE_UNITS[itemAt(match, 2).toLowerCase()] : undefined;
  if (!match || unit === undefined) {
    throw new Error(`invalid size "${value}" (expected a number with an optional unit such as KiB, MiB, GB)`);
  }
  return Math.floor(Number(match[1]) * unit);
}

/** Parses a rate such as "100Mbit", "12.5MB/s", "0" (unlimited) into bytes per second. */
export function parseRate(value: string | number): number {
  if (typeof value === 'number') return parseSize(value);
  const bits = /^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)bit(?:\/s|ps)?\s*$/i.exec(value);
  if (bits) {
    const scale = bits[3] ? { '': 1, k: 2 ** 10, m: 2 ** 20, g: 2 ** 30, t: 2 ** 40 } : { '': 1, k: 1e3, m: 1e6, g: 1e9, t: 1e12 };
    return Math.floor((Number(bits[1]) * scale[itemAt(bits, 2).toLowerCase() as keyof typeof scale]) / 8);
  }
  return parseSize(value.replace(/\/s$/i, ''));
}

export function formatBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}
