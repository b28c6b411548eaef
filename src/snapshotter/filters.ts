// The subset of containerd's filter language that snapshot List requests use, e.g.
//   labels."containerd.io/snapshot.ref"==sha256:…,parent=="ns/3/sha256:…"
// A filter is selectors joined by "," (all must match); a request's filters are alternatives.
// Selectors: `field`, `field==value`, `field!=value`, `field~=regexp`; fields are `name`,
// `parent`, `kind` and `labels.<key>` (a key may be "quoted"); values bare, "quoted" or /regexp/.
import { SnapshotError } from './errors.js';

export interface Filterable {
  name: string;
  parent: string;
  kind: string;
  labels: Record<string, string>;
}

interface Selector {
  path: string[];
  op?: '==' | '!=' | '~=';
  value?: string;
}

export type Matcher = (item: Filterable) => boolean;

/** A matcher for `filters` (any of them); no filters match everything. */
export function compileFilters(filters: readonly string[]): Matcher {
  const parsed = filters.filter((f) => f.trim() !== '').map(parseFilter);
  if (parsed.length === 0) return () => true;
  return (item) => parsed.some((selectors) => selectors.every((s) => matches(s, item)));
}

function matches(selector: Selector, item: Filterable): boolean {
  const [head, ...rest] = selector.path;
  let actual: string | undefined;
  if (head === 'labels') actual = rest.length ? item.labels[rest.join('.')] : undefined;
  else if (head === 'name' || head === 'parent' || head === 'kind') actual = rest.length ? undefined : item[head];
  if (!selector.op) return actual !== undefined && actual !== '';
  if (selector.op === '==') return actual === selector.value;
  if (selector.op === '!=') return actual !== selector.value;
  return actual !== undefined && new RegExp(selector.value ?? '').test(actual);
}

function parseFilter(text: string): Selector[] {
  const p = new Parser(text);
  const selectors: Selector[] = [];
  for (;;) {
    selectors.push(p.selector());
    if (p.done()) return selectors;
    p.expect(',');
  }
}

class Parser {
  private pos = 0;
  constructor(private readonly text: string) {}

  done(): boolean {
    this.skipSpace();
    return this.pos >= this.text.length;
  }

  expect(token: string): void {
    this.skipSpace();
    if (!this.text.startsWith(token, this.pos)) this.fail(`expected "${token}"`);
    this.pos += token.length;
  }

  selector(): Selector {
    const path = [this.field()];
    while (this.peek() === '.') {
      this.pos++;
      path.push(this.field());
    }
    this.skipSpace();
    const op = (['==', '!=', '~='] as const).find((o) => this.text.startsWith(o, this.pos));
    if (!op) return { path };
    this.pos += 2;
    return { path, op, value: this.value() };
  }

  private field(): string {
    this.skipSpace();
    if (this.text[this.pos] === '"') return this.quoted();
    const m = /^[A-Za-z0-9_-]+/.exec(this.text.slice(this.pos));
    if (!m) this.fail('expected a field name');
    this.pos += m[0].length;
    return m[0];
  }

  private value(): string {
    this.skipSpace();
    const c = this.text[this.pos];
    if (c === '"') return this.quoted();
    if (c === '/') {
      let end = this.pos + 1;
      while (end < this.text.length && this.text[end] !== '/') end += this.text[end] === '\\' ? 2 : 1;
      if (end >= this.text.length) this.fail('unterminated /regexp/');
      const value = this.text.slice(this.pos + 1, end).replace(/\\\//g, '/');
      this.pos = end + 1;
      return value;
    }
    const m = /^[^,\s]+/.exec(this.text.slice(this.pos));
    if (!m) this.fail('expected a value');
    this.pos += m[0].length;
    return m[0];
  }

  private quoted(): string {
    let end = this.pos + 1;
    while (end < this.text.length && this.text[end] !== '"') end += this.text[end] === '\\' ? 2 : 1;
    if (end >= this.text.length) this.fail('unterminated quoted string');
    const raw = this.text.slice(this.pos, end + 1);
    this.pos = end + 1;
    try {
      return JSON.parse(raw) as string; // Go's strconv.Unquote escapes are a superset we do not need
    } catch {
      return this.fail(`bad quoted string ${raw}`);
    }
  }

  private peek(): string | undefined {
    return this.text[this.pos];
  }

  private skipSpace(): void {
    while (this.text[this.pos] === ' ') this.pos++;
  }

  private fail(message: string): never {
    throw new SnapshotError('INVALID_ARGUMENT', `filter "${this.text}" at ${this.pos}: ${message}`);
  }
}
