// The tree's layers, read from its import statements: areas import one way only, src/'s folders
// form no cycle, and the swarm's piece policy does no I/O (the simulator runs it as it is).

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

/** Every TypeScript file under the areas, relative to the root, with what it imports. */
function importGraph(): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  const walk = (dir: string) => {
    for (const entry of fs.readdirSync(path.join(ROOT, dir), { withFileTypes: true })) {
      const rel = path.posix.join(dir, entry.name);
      if (entry.isDirectory()) {
        if (entry.name !== 'node_modules' && entry.name !== 'results') walk(rel);
      } else if (/\.tsx?$/.test(entry.name)) {
        graph.set(rel, importsOf(rel));
      }
    }
  };
  for (const area of ['src', 'bench', 'sim', 'test']) walk(area);
  return graph;
}

/** The module specifiers a file imports or re-exports (statically or with import()), relative ones resolved against the root. */
function importsOf(file: string): string[] {
  const text = fs.readFileSync(path.join(ROOT, file), 'utf8');
  const specifiers = [
    ...text.matchAll(
      /(?:^|\s)(?:import|export)\s[^'"`;]*?from\s*['"]([^'"]+)['"]|import\s*\(\s*['"]([^'"]+)['"]\s*\)|^import\s+['"]([^'"]+)['"]/gm,
    ),
  ].map((m) => m[1] ?? m[2] ?? m[3] ?? '');
  return specifiers.map((spec) => (spec.startsWith('.') ? path.posix.normalize(path.posix.join(path.posix.dirname(file), spec)) : spec));
}

/** The area of a file: src, sim, bench, test/fixtures (shared with the benchmarks) or test. */
function area(file: string): string {
  if (file.startsWith('test/fixtures/')) return 'test/fixtures';
  return file.split('/')[0] ?? file;
}

/** src/'s top-level folder of a file (a file directly in src/ is its own). */
function srcFolder(file: string): string {
  return file.split('/').slice(0, 2).join('/');
}

/** The edges between groups (files mapped by `group`), each with one import that makes it. */
function groupEdges(graph: Map<string, string[]>, group: (file: string) => string | undefined): Map<string, Map<string, string>> {
  const edges = new Map<string, Map<string, string>>();
  for (const [file, imports] of graph) {
    const from = group(file);
    if (from === undefined) continue;
    for (const target of imports) {
      const to = graph.has(target.replace(/\.js$/, '.ts')) || graph.has(target.replace(/\.js$/, '.tsx')) ? group(target) : undefined;
      if (to === undefined || to === from) continue;
      let out = edges.get(from);
      if (!out) edges.set(from, (out = new Map()));
      if (!out.has(to)) out.set(to, `${file} imports ${target}`);
    }
  }
  return edges;
}

/** A cycle of groups, as the imports that close it, or undefined. */
function findCycle(edges: Map<string, Map<string, string>>): string[] | undefined {
  const state = new Map<string, 'open' | 'done'>();
  const trail: string[] = [];
  const visit = (node: string): string[] | undefined => {
    state.set(node, 'open');
    for (const [next, why] of edges.get(node) ?? []) {
      trail.push(why);
      if (state.get(next) === 'open') return [...trail];
      if (!state.has(next)) {
        const cycle = visit(next);
        if (cycle) return cycle;
      }
      trail.pop();
    }
    state.set(node, 'done');
    return undefined;
  };
  for (const node of edges.keys()) {
    if (state.has(node)) continue;
    const cycle = visit(node);
    if (cycle) return cycle;
  }
  return undefined;
}

const graph = importGraph();

describe('layers of the tree', () => {
  it('reads the imports of every area (the check would pass on nothing otherwise)', () => {
    for (const a of ['src', 'bench', 'sim', 'test', 'test/fixtures'])
      assert.ok(
        [...graph.keys()].some((f) => area(f) === a),
        `no files in ${a}`,
      );
    assert.ok(graph.get('sim/peer.ts')?.includes('src/peer/swarm/policy/candidate-order.js'), 'sim/peer.ts imports the policy');
  });

  it('has areas that import one way only: src alone; sim on src and bench; bench on src and the test fixtures', () => {
    const allowed: Record<string, string[]> = {
      src: [],
      sim: ['src', 'bench'],
      bench: ['src', 'test/fixtures'],
      'test/fixtures': ['src'],
      test: ['src', 'sim', 'bench', 'test/fixtures'],
    };
    const wrong: string[] = [];
    for (const [from, out] of groupEdges(graph, area)) {
      for (const [to, why] of out) if (!allowed[from]?.includes(to)) wrong.push(`${from} → ${to}: ${why}`);
    }
    assert.deepEqual(wrong, []);
    assert.equal(findCycle(groupEdges(graph, area)), undefined);
  });

  it("has no cycle between src/'s folders", () => {
    const cycle = findCycle(groupEdges(graph, (file) => (file.startsWith('src/') ? srcFolder(file) : undefined)));
    assert.equal(cycle, undefined, `a cycle of folders: ${cycle?.join('; ')}`);
  });

  it('finds a cycle when there is one (the check itself)', () => {
    const fake = new Map([
      ['src/a/x.ts', ['src/b/y.js']],
      ['src/b/y.ts', ['src/c/z.js']],
      ['src/c/z.ts', ['src/a/x.js']],
    ]);
    assert.equal(findCycle(groupEdges(fake, srcFolder))?.length, 3);
  });

  it("keeps the swarm's piece policy free of I/O: it imports nothing but its own files and types", () => {
    const policy = [...graph.keys()].filter((f) => f.startsWith('src/peer/swarm/policy/'));
    assert.ok(policy.length >= 5);
    for (const file of policy) {
      const text = fs.readFileSync(path.join(ROOT, file), 'utf8');
      for (const target of graph.get(file) ?? []) {
        const typeOnly = new RegExp(`import type [^;]*['"][^'"]*${path.posix.basename(target).replace('.', '\\.')}['"]`).test(text);
        assert.ok(target.startsWith('src/peer/swarm/policy/') || typeOnly, `${file} imports ${target}`);
      }
    }
  });
});
