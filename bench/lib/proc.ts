// Per-process figures from /proc: CPU time and resident memory.

import fs from 'node:fs';

const CLOCK_TICKS = 100; // USER_HZ on Linux x86-64

/** user+system CPU seconds consumed so far by `pid` (0 if it is gone). */
export function cpuSeconds(pid: number): number {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the ")" that closes the command name; utime and stime are fields 14 and 15.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS;
  } catch {
    return 0;
  }
}

/** A field of /proc/<pid>/status in bytes (VmRSS, VmHWM...), or undefined. */
export function statusBytes(pid: number, field: string): number | undefined {
  try {
    const text = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
    const match = new RegExp(`^${field}:\\s+(\\d+) kB$`, 'm').exec(text);
    return match ? Number(match[1]) * 1024 : undefined;
  } catch {
    return undefined;
  }
}

/** Samples VmRSS of `pid` every `intervalMs` until stopped; reports the largest sample. */
export function sampleRss(pid: number, intervalMs = 50): { stop(): { peakRss: number; samples: number } } {
  let peak = statusBytes(pid, 'VmRSS') ?? 0;
  let samples = 1;
  const timer = setInterval(() => {
    const rss = statusBytes(pid, 'VmRSS');
    if (rss === undefined) return;
    samples++;
    if (rss > peak) peak = rss;
  }, intervalMs);
  return {
    stop() {
      clearInterval(timer);
      const rss = statusBytes(pid, 'VmRSS');
      if (rss !== undefined && rss > peak) peak = rss;
      return { peakRss: peak, samples };
    },
  };
}
