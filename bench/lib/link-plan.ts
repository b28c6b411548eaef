// How each node of a cluster is linked, from one description that the emulated cluster (bench/)
// and the simulator (sim/) both read, so that a set-up means the same in both.
//
//   10mbit                          every node at 10 Mbit/s both ways
//   10mbit*24,3mbit*8               24 nodes at 10 Mbit/s and 8 at 3, dealt to the nodes in an order
//                                   drawn from the seed (the emulated cluster starts its nodes in
//                                   index order: with n24…n31 the slow ones, a scheduler that chains
//                                   peers as they come found them last, at the chains' ends)
//   20mbit/5mbit*16,10mbit          16 nodes with 20 Mbit/s down and 5 up, the rest at 10 both ways
//   lognormal(50gbit,0.3)*95%,5gbit a 95% share drawn from a log-normal (median 50 Gbit/s, σ 0.3 of
//                                   the natural log), the rest at 5 Gbit/s
//
// A group is RATE[*COUNT]: RATE is one term for both directions (one draw) or DOWN/UP; a term is a
// tc rate (parseBitRate) or lognormal(MEDIAN,SIGMA); COUNT is a number of nodes or a share (25%); one
// group may leave its count out and takes the nodes left. Changes during a run:
//
//   n7=1mbit@20s                    node n7's link goes to 1 Mbit/s both ways 20 s after the start
//   n7=0.1x@20s,n3=10mbit/1mbit@5s  a factor of its current rates; DOWN/UP as above
//
// The origin and the seed are not described here: their rates are the benchmark's --origin-rate.

import { formatBitRate, parseBitRate } from '../../src/common/units.js';
import { seededRandom } from './random.js';
import { itemAt } from '../../src/common/indexing.js';

/** A node's link from `at` seconds after the start on, in bits/s. */
export interface LinkStep {
  at: number;
  down: number;
  up: number;
}

export interface NodeLink {
  /** The description group the node came from, plus its changes: nodes with equal links share it. */
  group: string;
  /** The node's link over time: steps[0] is at 0; each holds until the next. */
  steps: [LinkStep, ...LinkStep[]];
}

export interface RateChange {
  node: number;
  at: number;
  /** New rates in bits/s, or factors of the node's rates at that moment. */
  down: number;
  up: number;
  relative: boolean;
  text: string;
}

/** A standard normal variate (Box–Muller). */
function normal(random: () => number): number {
  const u = 1 - random();
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * random());
}

/** One side of a group's rate: a fixed rate or a draw. */
type Term = (random: () => number) => number;

function parseTerm(text: string, where: string): Term {
  const m = /^lognormal\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\)$/i.exec(text);
  if (m) {
    const medianBits = parseBitRate(itemAt(m, 1));
    const sigma = Number(m[2]);
    if (!(sigma >= 0) || !Number.isFinite(sigma)) throw new Error(`${where}: lognormal σ must be a number ≥ 0, got "${m[2]}"`);
    return (random) => medianBits * Math.exp(sigma * normal(random));
  }
  if (/lognormal/i.test(text)) throw new Error(`${where}: write a distribution as lognormal(MEDIAN,SIGMA), e.g. lognormal(50gbit,0.3)`);
  const bits = parseBitRate(text);
  return () => bits;
}

/** Splits on commas outside parentheses. */
function splitTop(text: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    const ch = text[i];
    if (ch === '(') depth++;
    else if (ch === ')') depth--;
    else if (ch === ',' && depth === 0) {
      parts.push(text.slice(start, i));
      start = i + 1;
    }
  }
  parts.push(text.slice(start));
  return parts.map((p) => p.trim());
}

/** Splits DOWN/UP on the one slash outside parentheses (a term alone stands for both). */
function splitSides(text: string, where: string): [string, string | undefined] {
  let depth = 0;
  const slashes: number[] = [];
  for (let i = 0; i < text.length; i++) {
    if (text[i] === '(') depth++;
    else if (text[i] === ')') depth--;
    else if (text[i] === '/' && depth === 0) slashes.push(i);
  }
  if (slashes.length > 1) throw new Error(`${where}: one slash at most (DOWN/UP)`);
  if (slashes.length === 0) return [text.trim(), undefined];
  const slash = itemAt(slashes, 0);
  return [text.slice(0, slash).trim(), text.slice(slash + 1).trim()];
}

/**
 * Every node's link, from a description (see the top of this file) and optional changes.
 * Throws an error naming the bad group when the description cannot be read or does not add up
 * to `nodes`.
 */
export function planNodeLinks(description: string, nodes: number, changes = '', random = seededRandom(1)): NodeLink[] {
  if (!Number.isInteger(nodes) || nodes < 1) throw new Error(`nodes must be a positive integer, got ${nodes}`);
  const groups = splitTop(description);
  if (groups.some((g) => g === '')) throw new Error(`node rates "${description}": an empty group (two commas in a row?)`);
  const parsed = groups.map((group) => {
    const where = `node rates group "${group}"`;
    const star = /^(.*?)\*\s*(\d+(?:\.\d+)?)(%?)\s*$/.exec(group);
    const rateText = star ? itemAt(star, 1).trim() : group;
    let count: number | undefined;
    if (star) {
      const value = Number(star[2]);
      count = star[3] ? Math.round((value / 100) * nodes) : value;
      if (!Number.isInteger(count) || count < 0) throw new Error(`${where}: the count must be a whole number of nodes or a share like 25%`);
    }
    const [downText, upText] = splitSides(rateText, where);
    if (!downText) throw new Error(`${where}: no rate`);
    const down = parseTerm(downText, where);
    const up = upText === undefined ? undefined : parseTerm(upText, where);
    return { text: rateText, count, down, up };
  });
  const open = parsed.filter((g) => g.count === undefined);
  if (open.length > 1) throw new Error(`node rates "${description}": only one group may leave out its count (it takes the nodes left)`);
  const counted = parsed.reduce((sum, g) => sum + (g.count ?? 0), 0);
  if (counted > nodes || (open.length === 0 && counted !== nodes)) {
    throw new Error(
      `node rates "${description}" describe ${counted} nodes, not ${nodes}${open.length ? '' : ' (leave one count out to fill the rest)'}`,
    );
  }
  const links: NodeLink[] = [];
  for (const g of parsed) {
    const count = g.count ?? nodes - counted;
    for (let k = 0; k < count; k++) {
      const down = g.down(random);
      const up = g.up ? g.up(random) : down;
      links.push({ group: g.text, steps: [{ at: 0, down, up }] });
    }
  }
  // Groups dealt in a random order (Fisher-Yates, from the seed): no group gathers at one end.
  for (let i = links.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [links[i], links[j]] = [itemAt(links, j), itemAt(links, i)];
  }
  // In time order, so that a factor applies to the rates the node has at that moment.
  for (const change of parseRateChanges(changes, nodes).sort((x, y) => x.at - y.at)) {
    const link = itemAt(links, change.node);
    const steps = link.steps;
    let i = steps.length - 1;
    while (i > 0 && itemAt(steps, i).at > change.at) i--;
    const before = itemAt(steps, i);
    const step = change.relative
      ? { at: change.at, down: before.down * change.down, up: before.up * change.up }
      : { at: change.at, down: change.down, up: change.up };
    if (before.at === change.at) steps[i] = step;
    else steps.splice(i + 1, 0, step);
    link.group = `${link.group}, n${change.node} ${change.text}`;
  }
  return links;
}

/** `n7=1mbit@20s,n3=0.1x@15s`: see the top of this file. */
export function parseRateChanges(text: string, nodes: number): RateChange[] {
  if (!text.trim()) return [];
  return splitTop(text).map((item) => {
    const where = `rate change "${item}"`;
    const m = /^n(\d+)\s*=\s*(.+?)\s*@\s*(\d+(?:\.\d+)?)\s*s?$/.exec(item);
    if (!m) throw new Error(`${where}: write it as nNODE=RATE@SECONDS, e.g. n7=1mbit@20s or n7=0.1x@20s`);
    const node = Number(m[1]);
    if (node >= nodes) throw new Error(`${where}: there are only ${nodes} nodes (n0…n${nodes - 1})`);
    const [downText, upText] = splitSides(itemAt(m, 2), where);
    const side = (t: string): { value: number; relative: boolean } => {
      const factor = /^(\d+(?:\.\d+)?)x$/i.exec(t);
      if (factor) {
        const value = Number(factor[1]);
        if (!(value > 0)) throw new Error(`${where}: a factor must be positive`);
        return { value, relative: true };
      }
      return { value: parseBitRate(t), relative: false };
    };
    const down = side(downText);
    const up = upText === undefined ? down : side(upText);
    if (down.relative !== up.relative) throw new Error(`${where}: give both sides as rates or both as factors`);
    return { node, at: Number(m[3]), down: down.value, up: up.value, relative: down.relative, text: `${m[2]} at ${m[3]} s` };
  });
}

/** The link at `t` seconds. */
export function linkAt(link: NodeLink, t: number): LinkStep {
  let current = link.steps[0];
  for (const step of link.steps) if (step.at <= t) current = step;
  return current;
}

/** '10mbit' or '20mbit/5mbit' (down/up) for a step, for logs. */
export function formatLink(step: { down: number; up: number }): string {
  return step.down === step.up ? formatBitRate(step.down) : `${formatBitRate(step.down)}/${formatBitRate(step.up)}`;
}
