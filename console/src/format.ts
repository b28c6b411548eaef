// How numbers, digests and times are written on every page.

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

export function bytes(n: number): string {
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${n} B` : `${value.toFixed(value < 10 ? 2 : 1)} ${UNITS[unit]}`;
}

export function percent(ratio: number): string {
  return `${(ratio * 100).toFixed(ratio > 0 && ratio < 0.1 ? 1 : 0)}%`;
}

/** sha256:0123456789ab… — enough to tell layers apart; the full digest is in the title. */
export function shortDigest(digest: string): string {
  const [algorithm, hex] = digest.split(':');
  return hex ? `${algorithm}:${hex.slice(0, 12)}` : digest;
}

export function ago(iso: string, now = Date.now()): string {
  return secondsAgo(Math.max(0, Math.round((now - Date.parse(iso)) / 1000)));
}

export function secondsAgo(seconds: number): string {
  if (seconds < 2) return 'just now';
  if (seconds < 120) return `${seconds} s ago`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 172800) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} days ago`;
}

export function dateTime(iso: string): string {
  return new Date(iso).toLocaleString(undefined, { dateStyle: 'medium', timeStyle: 'medium' });
}
