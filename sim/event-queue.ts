// The simulator's clock and agenda: a binary min-heap of events ordered by time, then by the
// order they were scheduled in (so events at the same instant run first-in first-out).

import { itemAt } from '../src/common/indexing.js';

export type Action = () => void;

interface Entry {
  t: number;
  seq: number;
  run: Action;
}

export class EventQueue {
  private heap: Entry[] = [];
  private seq = 0;
  /** Simulated seconds. */
  now = 0;
  /** Events run so far. */
  processed = 0;

  get size(): number {
    return this.heap.length;
  }

  /** Runs `run` at absolute time `t` (never before now). */
  at(t: number, run: Action): void {
    const entry: Entry = { t: t < this.now ? this.now : t, seq: this.seq++, run };
    const heap = this.heap;
    let i = heap.length;
    heap.push(entry);
    while (i > 0) {
      const parent = (i - 1) >> 1;
      const p = itemAt(heap, parent);
      if (p.t < entry.t || (p.t === entry.t && p.seq < entry.seq)) break;
      heap[i] = p;
      i = parent;
    }
    heap[i] = entry;
  }

  /** Runs `run` `delay` seconds from now. */
  after(delay: number, run: Action): void {
    this.at(this.now + delay, run);
  }

  /** Time of the next event, or Infinity. */
  peekTime(): number {
    return this.heap[0]?.t ?? Infinity;
  }

  /** Removes the next event, advances the clock to it and runs it. */
  runNext(): void {
    const top = this.pop();
    if (!top) return;
    this.now = top.t;
    this.processed++;
    top.run();
  }

  /** Moves the clock forward without running anything (for other event sources, e.g. the network). */
  advanceTo(t: number): void {
    if (t > this.now) this.now = t;
  }

  private pop(): Entry | undefined {
    const heap = this.heap;
    const top = heap[0];
    const last = heap.pop();
    if (top === undefined || last === undefined) return undefined;
    const n = heap.length;
    if (n > 0) {
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        if (l >= n) break;
        const r = l + 1;
        let c = l;
        if (r < n) {
          const a = itemAt(heap, l);
          const b = itemAt(heap, r);
          if (b.t < a.t || (b.t === a.t && b.seq < a.seq)) c = r;
        }
        const child = itemAt(heap, c);
        if (last.t < child.t || (last.t === child.t && last.seq < child.seq)) break;
        heap[i] = child;
        i = c;
      }
      heap[i] = last;
    }
    return top;
  }
}
