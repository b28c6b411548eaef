import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { silentLogger } from '../../src/common/log.js';
import type { BlobTask } from '../../src/peer/blob-task.js';
import { ParentBusyError } from '../../src/peer/swarm/parent-link.js';
import type { ParentSet } from '../../src/peer/swarm/parent-set.js';
import { PiecesFromParents } from '../../src/peer/swarm/pieces-from-parents.js';
import { WantedPieces } from '../../src/peer/swarm/wanted-pieces.js';
import type { GrowingPiece } from '../../src/peer/growing-piece.js';

// A parent that answered 429 is left alone for a while (policy/busy-backoff.ts). When that wait
// ends nothing else need happen: a parent holding the whole blob sends no more bitmap news. The
// download must ask again by itself; before, it sat idle until the watchdog (a simulated node at
// 97 Gbit/s lost 0.83 s so).

const PIECE = 4 << 20;

/** The few BlobTask members the fetcher reads: a blob of two pieces, none held. */
function task(): BlobTask {
  return {
    digest: `sha256:${'cd'.repeat(32)}`,
    layout: { pieceCount: 2, pieceSize: PIECE, size: 2 * PIECE },
    hasPiece: () => false,
    wantedInBackgroundOnly: () => false,
    streamingReaders: 0,
    blob: { storedPieceCount: 0 },
  } as unknown as BlobTask;
}

/** A parent holding the whole blob that answers 429 to its first request, leaving itself alone `waitMs`, then never answers. */
function busyOnceParent(waitMs: number) {
  const asked: number[] = [];
  const link = {
    id: 'parent|task',
    seed: false,
    onDemand: false,
    closed: false,
    piecesAtOnce: 1,
    inflight: 0,
    rate: 0,
    busyUntil: 0,
    offers: () => true,
    carries: () => true,
    holdsWhole: () => true,
    attemptStarted() {
      this.inflight++;
    },
    attemptEnded() {
      this.inflight--;
    },
    fetchPiece(_index: number, _begin: () => GrowingPiece, signal: AbortSignal): Promise<Buffer> {
      asked.push(Date.now());
      if (asked.length === 1) {
        this.busyUntil = Date.now() + waitMs;
        return Promise.reject(new ParentBusyError('no free upload slot'));
      }
      // On its way until the test stops the fetcher.
      return new Promise<Buffer>((_resolve, reject) => signal.addEventListener('abort', () => reject(new Error('aborted'))));
    },
  };
  return { link, asked };
}

describe('a parent that answered busy', () => {
  it('is asked again when its wait ends, with no news from it meanwhile', async () => {
    const { link, asked } = busyOnceParent(60);
    const parents = Object.assign([link], { hasNodeParents: true }) as unknown as ParentSet;
    const wanted = new WantedPieces(() => false);
    wanted.add({ first: 0, last: 1 });
    const fetcher = new PiecesFromParents(
      task(),
      wanted,
      parents,
      { parallelism: 4, perParent: 1, pieceTimeoutMs: 60_000 },
      { report: () => undefined, beginPiece: () => ({}) as GrowingPiece, settled: () => undefined, putOff: () => undefined },
      silentLogger,
    );
    fetcher.vouch({ digests: { 0: `sha256:${'0'.repeat(64)}`, 1: `sha256:${'1'.repeat(64)}` } });
    fetcher.run();
    fetcher.pump();
    await sleep(400);
    fetcher.stop();
    assert.equal(asked.length, 2, 'asked once, told busy, asked again');
    const [first = 0, second = 0] = asked;
    assert.ok(second - first >= 55, `not before its wait ended (${second - first} ms)`);
  });
});
