// Summarize V8 .cpuprofile files (as written by node --cpu-prof): self time per function,
// and total (inclusive) time per function, top N. Usage:
//   npx tsx bench/lib/cpuprofile.ts FILE.cpuprofile [--top 25]

import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

interface Node {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  hitCount?: number;
  children?: number[];
}
interface Profile {
  nodes: Node[];
  startTime: number;
  endTime: number;
  samples: number[];
  timeDeltas: number[];
}

export function summarize(file: string, top = 25): string {
  const profile = JSON.parse(fs.readFileSync(file, 'utf8')) as Profile;
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const nodeOf = (id: number): Node => {
    const node = byId.get(id);
    if (!node) throw new Error(`${file}: sample or parent ${id} names no node of the profile`);
    return node;
  };
  const selfUs = new Map<number, number>();
  for (const [i, id] of profile.samples.entries()) {
    selfUs.set(id, (selfUs.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0));
  }
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const label = (n: Node) => {
    const url = n.callFrame.url ? path.basename(n.callFrame.url.replace(/^file:\/\//, '')) : '';
    return `${n.callFrame.functionName || '(anonymous)'} ${url}${url ? ':' + (n.callFrame.lineNumber + 1) : ''}`;
  };
  const self = new Map<string, number>();
  const total = new Map<string, number>();
  for (const [id, us] of selfUs) {
    const node = nodeOf(id);
    self.set(label(node), (self.get(label(node)) ?? 0) + us);
    const seen = new Set<string>();
    for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) {
      const l = label(nodeOf(cur));
      if (seen.has(l)) continue;
      seen.add(l);
      total.set(l, (total.get(l) ?? 0) + us);
    }
  }
  const wall = (profile.endTime - profile.startTime) / 1e6;
  const fmt = (m: Map<string, number>) =>
    [...m]
      .sort((a, b) => b[1] - a[1])
      .slice(0, top)
      .map(([l, us]) => `${(us / 1e6).toFixed(3).padStart(8)} s  ${l}`)
      .join('\n');
  return `${path.basename(file)}: ${wall.toFixed(2)} s profiled\n-- self --\n${fmt(self)}\n-- total --\n${fmt(total)}`;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const files = process.argv.slice(2).filter((a) => !a.startsWith('--') && !/^\d+$/.test(a));
  const topAt = process.argv.indexOf('--top');
  const top = topAt > 0 ? Number(process.argv[topAt + 1]) : 25;
  for (const f of files) console.log(summarize(f, top));
}
