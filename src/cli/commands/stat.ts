import type { Command } from 'commander';
import { request } from 'undici';
import { UserError } from '../../common/errors.js';
import { formatBytes } from '../../common/units.js';
import type { TaskStatus } from '../../peer/daemon.js';
import { itemAt } from '../../common/indexing.js';

/** The flags of `starling stat` as commander parses them. */
interface StatFlags {
  peer: string;
  json?: boolean;
}

export function registerStatCommand(program: Command): void {
  program
    .command('stat')
    .description("show the peer's tasks: how much of each blob is stored and where its bytes came from")
    .option('--peer <url>', 'the local peer mirror', 'http://127.0.0.1:65001')
    .option('--json', 'print JSON')
    .action(async (options: StatFlags) => {
      let tasks: TaskStatus[];
      try {
        const response = await request(new URL('/_starling/tasks', options.peer));
        if (response.statusCode !== 200) throw new Error(`status ${response.statusCode}`);
        tasks = ((await response.body.json()) as { tasks: TaskStatus[] }).tasks;
      } catch (error) {
        throw new UserError(`cannot read tasks from the peer at ${options.peer}: ${(error as Error).message}`);
      }
      if (options.json) return void console.log(JSON.stringify(tasks, null, 2));
      const rows = tasks.map((t) => [
        t.digest.slice(0, 19),
        formatBytes(t.size),
        t.complete ? 'complete' : `${((t.storedBytes / Math.max(1, t.size)) * 100).toFixed(0)}%`,
        formatBytes(t.bytesFrom.peer),
        formatBytes(t.bytesFrom.seed),
        formatBytes(t.bytesFrom.origin),
        t.public ? 'public' : 'private',
      ]);
      const header = ['TASK', 'SIZE', 'STORED', 'FROM PEERS', 'FROM SEEDS', 'FROM ORIGIN', 'ACCESS'];
      const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => itemAt(r, i).length)));
      for (const row of [header, ...rows]) console.log(row.map((cell, i) => cell.padEnd(itemAt(widths, i))).join('  '));
      const sum = (key: keyof TaskStatus['bytesFrom']) => tasks.reduce((total, t) => total + t.bytesFrom[key], 0);
      console.log(
        `\nbytes from peers ${formatBytes(sum('peer'))}, seeds ${formatBytes(sum('seed'))}, origin ${formatBytes(sum('origin'))}`,
      );
    });
}
