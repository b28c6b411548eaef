import { createHash, timingSafeEqual } from 'node:crypto';
import { readFileSync, unwatchFile, watchFile, type Stats } from 'node:fs';
import type { Logger } from './log.js';
import { UserError } from './errors.js';

/** How often a token file is checked for a new version (a Kubernetes Secret update lands within a minute or so). */
const WATCH_INTERVAL_MS = 5_000;

/**
 * The cluster token shared by peers, schedulers and the manager, read from a file of one token per
 * line. The first line is the one this process sends; every line is accepted from others. That
 * lets an operator rotate it with no gap, one file version at a time, each reaching every process
 * before the next: `OLD` → `OLD NEW` (all accept the new one) → `NEW OLD` (all send it) → `NEW`.
 * `watch()` re-reads the file when it changes; a version that cannot be used is logged and the
 * tokens in use stay, so a bad edit never locks the cluster out.
 */
export class ClusterToken {
  private tokens: string[];
  private digests: Buffer[];

  private constructor(
    readonly path: string,
    tokens: string[],
  ) {
    this.tokens = tokens;
    this.digests = tokens.map(bearerDigest);
  }

  /** Reads the file; refuses one that is unreadable, empty, or holds a token too short or with spaces. */
  static fromFile(path: string): ClusterToken {
    return new ClusterToken(path, readTokens(path));
  }

  /** A token given in memory (tests and tools); it is never re-read. */
  static of(...tokens: string[]): ClusterToken {
    tokens.forEach((token, index) => checkToken(token, `token ${index + 1}`));
    if (tokens.length === 0) throw new UserError('no cluster token given');
    return new ClusterToken('', tokens);
  }

  /** The token this process presents: the file's first line. */
  get current(): string {
    return this.tokens[0] ?? '';
  }

  /** An Authorization header for requests to other parts of the cluster. */
  get authorization(): string {
    return `Bearer ${this.current}`;
  }

  /**
   * Whether an Authorization header is `Bearer <one of the tokens>`, compared in constant time:
   * both sides are hashed first, and every token is compared, so neither the tokens' bytes, their
   * lengths nor which one matched show in how long a wrong guess takes.
   */
  accepts(header: string | undefined): boolean {
    const given = createHash('sha256')
      .update(header ?? '')
      .digest();
    let matched = false;
    for (const expected of this.digests) matched = timingSafeEqual(given, expected) || matched;
    return matched;
  }

  /** Follows the file: a new version replaces the tokens once it reads well. Returns a function that stops it. */
  watch(log: Logger): () => void {
    if (!this.path) return () => undefined;
    const path = this.path;
    const changed = (now: Stats, before: Stats) => {
      if (now.mtimeMs === before.mtimeMs && now.size === before.size && now.ino === before.ino) return;
      this.reload(log);
    };
    watchFile(path, { interval: WATCH_INTERVAL_MS, persistent: false }, changed);
    return () => unwatchFile(path, changed);
  }

  /** Reads the file again now; keeps the tokens in use if the new version cannot be used. */
  reload(log: Logger): void {
    let tokens: string[];
    try {
      tokens = readTokens(this.path);
    } catch (error) {
      log.error(
        { file: this.path, err: (error as Error).message },
        'cluster token file changed but cannot be used; keeping the tokens in use',
      );
      return;
    }
    if (tokens.join('\n') === this.tokens.join('\n')) return;
    const sentChanged = tokens[0] !== this.tokens[0];
    this.tokens = tokens;
    this.digests = tokens.map(bearerDigest);
    log.info({ file: this.path, accepted: tokens.length, sentChanged }, 'cluster token file reloaded');
  }
}

function readTokens(path: string): string[] {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    throw new UserError(`cannot read cluster token file ${path}: ${(error as Error).message}`);
  }
  const lines = text
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line !== '');
  if (lines.length === 0) throw new UserError(`cluster token file ${path} is empty`);
  lines.forEach((line, index) => checkToken(line, `line ${index + 1} of cluster token file ${path}`));
  return lines;
}

function checkToken(token: string, where: string): void {
  if (token.length < 16) throw new UserError(`the cluster token on ${where} is shorter than 16 characters`);
  if (/\s/.test(token)) throw new UserError(`the cluster token on ${where} contains whitespace`);
}

function bearerDigest(token: string): Buffer {
  return createHash('sha256').update(`Bearer ${token}`).digest();
}

/** Reads the cluster token file, if one is named. */
export function readTokenFile(path: string | undefined): ClusterToken | undefined {
  return path ? ClusterToken.fromFile(path) : undefined;
}
