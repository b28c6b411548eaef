// What TLS costs on the upload path: a child reading every piece of a cached blob from a parent's
// upload port, over plain TCP (the parent sends with sendfile) and over TLS (the parent encrypts
// through buffers, the child decrypts into its piece buffers), alternating round by round against
// two parents on this machine that hold the same blob.
//
//   npx tsc -p . && npx tsx bench/upload-tls.ts [--size 512MB] [--rounds 5] [--at-once 4]
//
// Prints each round's throughput and the parent's CPU seconds per GB on each side, and the
// median ratio TLS / plain. Both ends run on this machine's two cores: it measures CPU per byte,
// which is what TLS adds, not a network.

import { readFile } from 'node:fs/promises';
import { parseArgs } from 'node:util';
import { PieceFetcher } from '../src/peer/swarm/piece-fetcher.js';
import { piecePath } from '../src/rpc/upload-api.js';
import { pieceBounds, pieceLayout } from '../src/storage/piece-plan.js';
import { pushRandomBlob } from '../test/fixtures/images.js';
import { clusterToken, pullThrough, startPeer, startScheduler, type RunningPeerProcess } from '../test/fixtures/peer.js';
import { startRegistry } from '../test/fixtures/registry.js';
import { testTlsFiles, tlsArgs } from '../test/fixtures/tls.js';
import { parseSize } from '../src/common/units.js';
import { fixed, median, table } from './lib/stats.js';

const { values } = parseArgs({
  options: {
    size: { type: 'string', default: '512MB' },
    rounds: { type: 'string', default: '5' },
    'at-once': { type: 'string', default: '4' },
  },
  strict: true,
});
const size = parseSize(values.size);
const rounds = Number(values.rounds);
const atOnce = Number(values['at-once']);

/** The parent's user + system CPU seconds so far (from /proc). */
async function cpuSeconds(pid: number): Promise<number> {
  // After the command's name in parentheses: state, ppid, … utime (14th field), stime (15th).
  const [, afterName] = (await readFile(`/proc/${pid}/stat`, 'utf8')).split(') ');
  if (afterName === undefined) throw new Error(`/proc/${pid}/stat has no ") " after the command name`);
  const fields = afterName.split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

async function main(): Promise<void> {
  const registry = await startRegistry();
  const running: Array<{ stop(): Promise<void> }> = [registry];
  try {
    const blob = await pushRandomBlob(registry, 'bench/tls', size);
    const token = (await clusterToken()).token;
    const tls = await testTlsFiles();
    const clientTls = { ca: await readFile(tls.ca), cert: await readFile(tls.cert), key: await readFile(tls.key) };
    const parents: Record<'plain' | 'tls', RunningPeerProcess> = {} as never;
    for (const [side, ip, args] of [
      ['plain', '127.0.70.2', []],
      ['tls', '127.0.70.4', await tlsArgs()],
    ] as const) {
      const scheduler = await startScheduler({
        ip: ip.replace(/\d+$/, (n) => String(Number(n) - 1)),
        extraArgs: [...args, '--log-level', 'warn'],
      });
      running.push(scheduler);
      const peer = await startPeer({
        ip,
        schedulers: [scheduler.address],
        insecure: [registry.host],
        extraArgs: [...args, '--log-level', 'warn'],
      });
      running.push(peer);
      const pulled = await pullThrough(peer, registry, 'bench/tls', blob.digest);
      if (pulled.digest !== blob.digest) throw new Error(`${side} parent did not store the blob`);
      parents[side] = peer;
    }
    const layout = pieceLayout(size);
    const headers = `authorization: Bearer ${token}\r\nx-starling-origin: ${registry.url}/v2/bench/tls/blobs/${blob.digest}\r\n`;

    /** Every piece from one parent, `atOnce` at a time: seconds, and the parent's CPU seconds. */
    const readAll = async (side: 'plain' | 'tls') => {
      const parent = parents[side];
      const { uploadPort } = parent.options;
      if (uploadPort === undefined) throw new Error(`the ${side} parent has no upload port (started without a scheduler?)`);
      const fetcher = new PieceFetcher(new URL(parent.url).hostname, uploadPort, headers, side === 'tls' ? clientTls : undefined);
      const cpuBefore = await cpuSeconds(parent.service.pid);
      const started = performance.now();
      let next = 0;
      await Promise.all(
        Array.from({ length: atOnce }, async () => {
          while (next < layout.pieceCount) {
            const index = next++;
            const buffer = Buffer.allocUnsafe(pieceBounds(layout, index).length);
            const head = await fetcher.get(
              piecePath(blob.digest, index),
              () => ({ buffer, advance: () => undefined }),
              new AbortController().signal,
            );
            if (head.status !== 200) throw new Error(`${side}: piece ${index} answered ${head.status}`);
          }
        }),
      );
      const seconds = (performance.now() - started) / 1000;
      fetcher.close();
      return { seconds, cpu: (await cpuSeconds(parent.service.pid)) - cpuBefore };
    };

    await readAll('plain'); // warm the page cache and both sides' code paths
    await readAll('tls');
    const rows: string[][] = [];
    const ratios: number[] = [];
    for (let round = 1; round <= rounds; round++) {
      const order: Array<'plain' | 'tls'> = round % 2 ? ['plain', 'tls'] : ['tls', 'plain'];
      const result = new Map<'plain' | 'tls', { seconds: number; cpu: number }>();
      for (const side of order) result.set(side, await readAll(side));
      const measured = (side: 'plain' | 'tls') => {
        const m = result.get(side);
        if (!m) throw new Error(`round ${round}: ${side} was not measured`);
        return m;
      };
      const rate = (side: 'plain' | 'tls') => size / measured(side).seconds / 1e6;
      const cpuPerGb = (side: 'plain' | 'tls') => (measured(side).cpu / size) * 1e9;
      ratios.push(rate('tls') / rate('plain'));
      rows.push([
        String(round),
        fixed(rate('plain'), 0),
        fixed(rate('tls'), 0),
        fixed(rate('tls') / rate('plain'), 2),
        fixed(cpuPerGb('plain'), 2),
        fixed(cpuPerGb('tls'), 2),
      ]);
    }
    console.log(table(['round', 'plain MB/s', 'TLS MB/s', 'TLS / plain', 'parent CPU s/GB plain', 'parent CPU s/GB TLS'], rows));
    console.log(
      `\nmedian throughput ratio TLS / plain over ${rounds} rounds: ${fixed(median(ratios), 2)} (${size} bytes, ${atOnce} pieces at once)`,
    );
  } finally {
    for (const process of running.reverse()) await process.stop().catch(() => undefined);
  }
}

await main();
