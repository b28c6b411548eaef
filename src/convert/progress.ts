/** One status line on stderr, redrawn in place; silent unless stderr is a terminal. */
export class Progress {
  private readonly enabled: boolean;
  private last = 0;

  constructor(private readonly stream: NodeJS.WriteStream = process.stderr) {
    this.enabled = Boolean(stream.isTTY);
  }

  /** Redraws the line, at most ten times a second. */
  update(text: string): void {
    if (!this.enabled) return;
    const now = Date.now();
    if (now - this.last < 100) return;
    this.last = now;
    this.stream.write(`\r\x1b[K${text.slice(0, (this.stream.columns ?? 100) - 1)}`);
  }

  /** Replaces the line with a final one that stays. */
  done(text: string): void {
    if (!this.enabled) return;
    this.last = 0;
    this.stream.write(`\r\x1b[K${text}\n`);
  }
}

export function megabytes(bytes: number): string {
  return `${(bytes / 1e6).toFixed(1)} MB`;
}
