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

/** What a process is, for a CPU breakdown: `starling <subcommand>`, else its program's name. */
export function programOf(pid: number): string | undefined {
  let argv: string[];
  try {
    argv = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
  } catch {
    return undefined;
  }
  const cli = argv.findIndex((arg) => arg.endsWith('/cli/main.js'));
  if (cli >= 0) return `starling ${argv[cli + 1] ?? ''}`.trim();
  const program = argv[0]?.split('/').pop();
  return program === 'nsenter' ? undefined : program; // nsenter execs the program: counted under it
}

/**
 * CPU seconds by program of the processes `pids()` returns, sampled every `intervalMs` until
 * stop(): processes that exit between samples (a short `ctr` call) are counted up to their last
 * sample, so short ones are undercounted.
 */
export function startProgramCpuSampler(pids: () => number[], intervalMs = 500): { stop(): Record<string, number> } {
  const last = new Map<number, { program: string; seconds: number }>();
  const sample = () => {
    for (const pid of pids()) {
      const program = last.get(pid)?.program ?? programOf(pid);
      if (program) last.set(pid, { program, seconds: cpuSeconds(pid) });
    }
  };
  sample();
  // Processes alive at the start count only what they use from now on.
  const base = new Map([...last].map(([pid, { seconds }]) => [pid, seconds]));
  const timer = setInterval(sample, intervalMs);
  timer.unref();
  return {
    stop() {
      clearInterval(timer);
      sample();
      const byProgram: Record<string, number> = {};
      for (const [pid, { program, seconds }] of last) byProgram[program] = (byProgram[program] ?? 0) + seconds - (base.get(pid) ?? 0);
      return Object.fromEntries(
        Object.entries(byProgram)
          .sort((a, b) => b[1] - a[1])
          .map(([k, v]) => [k, +v.toFixed(2)]),
      );
    },
  };
}

/** `roots` and every process below them (containers run in namespaces of their own, below their shims). */
export function withDescendants(roots: number[]): number[] {
  const parent = new Map<number, number>();
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${entry}/stat`, 'utf8');
      parent.set(Number(entry), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
    } catch {
      // gone
    }
  }
  const inside = new Set(roots);
  for (const pid of parent.keys()) {
    const chain: number[] = [];
    let at: number | undefined = pid;
    while (at !== undefined && at > 1 && !inside.has(at) && chain.length < 64) {
      chain.push(at);
      at = parent.get(at);
    }
    if (at !== undefined && inside.has(at)) for (const p of chain) inside.add(p);
  }
  return [...inside];
}
