// What opening an image's eStargz layers costs a node's FUSE server in CPU before any file is read:
// the footer and the TOC read, checked and indexed (openEstargz), then the file tree built from it
// (LayerTree), per layer, from local files. The first round runs in this fresh process, as a FUSE
// server meets its first image (cold: the code not yet optimized); later rounds show the warm cost.
//
//   npx tsx bench/toc-open.ts BLOB... [--rounds 5]
//
// BLOB: eStargz layer files, e.g. the e2e image's (bench/e2e-cluster.ts caches it under /var/tmp:
// its lazy/blobs/sha256/ holds the layers, and manifests and configs, which are skipped).
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { EstargzError, fileSource, openEstargz, type EstargzReader } from '../src/estargz/index.js';
import { LayerTree } from '../src/lazy/layer-tree.js';
import { fixed, median, table } from './lib/stats.js';

const { values: args, positionals: blobs } = parseArgs({
  options: { rounds: { type: 'string', default: '5' } },
  allowPositionals: true,
  strict: true,
});
const rounds = Number(args.rounds);
if (!Number.isInteger(rounds) || rounds < 2) throw new Error(`--rounds must be an integer ≥ 2, got ${args.rounds}`);
if (blobs.length === 0) throw new Error('name at least one eStargz blob');

interface Timing {
  openMs: number;
  treeMs: number;
  entries: number;
}

/** One layer opened and its tree built; undefined for a blob that is no eStargz layer. */
async function openOnce(blob: string): Promise<Timing | undefined> {
  const source = await fileSource(blob);
  try {
    const started = performance.now();
    let reader: EstargzReader;
    try {
      reader = await openEstargz(source);
    } catch (error) {
      if (error instanceof EstargzError) return undefined;
      throw error;
    }
    const opened = performance.now();
    new LayerTree(reader);
    return { openMs: opened - started, treeMs: performance.now() - opened, entries: reader.entries.length };
  } finally {
    await source.close();
  }
}

const byBlob = new Map<string, Timing[]>();
for (let round = 0; round < rounds; round++) {
  for (const blob of blobs) {
    const timing = await openOnce(blob);
    if (!timing) continue;
    byBlob.set(blob, [...(byBlob.get(blob) ?? []), timing]);
  }
}
if (byBlob.size === 0) throw new Error('none of the blobs is an eStargz layer');

const rows: string[][] = [];
const sum = { entries: 0, coldOpen: 0, coldTree: 0, warmOpen: 0, warmTree: 0 };
for (const [blob, timings] of byBlob) {
  const [cold, ...warm] = timings;
  if (!cold) continue;
  const warmOpen = median(warm.map((t) => t.openMs));
  const warmTree = median(warm.map((t) => t.treeMs));
  sum.entries += cold.entries;
  sum.coldOpen += cold.openMs;
  sum.coldTree += cold.treeMs;
  sum.warmOpen += warmOpen;
  sum.warmTree += warmTree;
  const size = fs.statSync(blob).size;
  rows.push([
    path.basename(blob).slice(0, 12),
    `${fixed(size / 1e6, 1)} MB`,
    String(cold.entries),
    fixed(cold.openMs, 1),
    fixed(cold.treeMs, 1),
    fixed(warmOpen, 1),
    fixed(warmTree, 1),
  ]);
}
rows.push(['all', '', String(sum.entries), fixed(sum.coldOpen, 1), fixed(sum.coldTree, 1), fixed(sum.warmOpen, 1), fixed(sum.warmTree, 1)]);
console.log(
  table(['layer', 'blob', 'entries', 'cold open ms', 'cold tree ms', `warm open ms (median of ${rounds - 1})`, 'warm tree ms'], rows),
);
