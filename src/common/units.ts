import { itemAt } from './indexing.js';

const SIZE_UNITS: Record<string, number> = {
  '': 1,
  b: 1,
  k: 1e3,
  kb: 1e3,
  m: 1e6,
  mb: 1e6,
  g: 1e9,
  gb: 1e9,
  t: 1e12,
  tb: 1e12,
  ki: 2 ** 10,
  kib: 2 ** 10,
  mi: 2 ** 20,
  mib: 2 ** 20,
  gi: 2 ** 30,
  gib: 2 ** 30,
  ti: 2 ** 40,
  tib: 2 ** 40,
};

/**
 * Parses "4MiB", "1.5GB", "1048576" into bytes (rounded to the nearest byte: 4.1 × 10^6 is
 * 4099999.9999999995 in floating point). Throws a message naming the bad value.
 */
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
  return Math.round(Number(match[1]) * unit);
}

const BIT_PREFIXES: Record<string, number> = { '': 1, k: 1e3, m: 1e6, g: 1e9, t: 1e12, ki: 2 ** 10, mi: 2 ** 20, gi: 2 ** 30, ti: 2 ** 40 };

/**
 * A rate written with its unit, in bits per second: bits as tc writes them ("25mbit" = 25 × 10^6
 * bit/s, "1gbit", "500kbit", "1mibit"; "/s" or "ps" may follow) or bytes per second ("12.5MB/s",
 * "1MiB/s"). A bare number is in `bareUnit`. "mbps" is refused: tc reads it as megabytes, most
 * people as megabits.
 */
function rateInBits(text: string, bareUnit: 'bit' | 'byte'): number {
  const match = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)(\/s)?\s*$/.exec(text);
  if (match) {
    const amount = Number(match[1]);
    const unit = itemAt(match, 2).toLowerCase();
    if (unit === '') return bareUnit === 'bit' ? amount : amount * 8;
    const bits = /^([kmgt]?i?)bit(?:ps)?$/.exec(unit);
    const prefix = bits ? BIT_PREFIXES[itemAt(bits, 1)] : undefined;
    if (prefix !== undefined) return amount * prefix;
    const bytes = SIZE_UNITS[unit];
    if (bytes !== undefined) return amount * bytes * 8;
  }
  throw new Error(`invalid rate "${text}" (expected a number with a unit such as 100mbit, 1gbit, 12.5MB/s)`);
}

/** Parses a rate such as "100Mbit", "12.5MB/s" or "0" (unlimited) into bytes per second; a bare number is bytes per second. */
export function parseRate(value: string | number): number {
  if (typeof value === 'number') return parseSize(value);
  return Math.round(rateInBits(value, 'byte') / 8);
}

/**
 * Parses a link's rate, as tc's caps and the benchmarks' flags give it ("25mbit", "1gbit"), into
 * bits per second; a bare number is bits per second. A link of 0 bit/s carries nothing: refused.
 */
export function parseBitRate(value: string | number): number {
  const bits = typeof value === 'number' ? value : rateInBits(value, 'bit');
  if (!(bits > 0)) throw new Error(`a link's rate must be positive, got "${value}"`);
  return bits;
}

/** A rate in bits per second as tc writes it: 50gbit, 25mbit, 500kbit (the inverse of parseBitRate). */
export function formatBitRate(bitsPerSecond: number): string {
  if (bitsPerSecond >= 1e9 && bitsPerSecond % 1e8 === 0) return `${bitsPerSecond / 1e9}gbit`;
  if (bitsPerSecond >= 1e6) return `${+(bitsPerSecond / 1e6).toFixed(3)}mbit`;
  return `${+(bitsPerSecond / 1e3).toFixed(3)}kbit`;
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
