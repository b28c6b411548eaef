import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { describe, it } from 'node:test';
import { Agent } from 'undici';
import { silentLogger } from '../../src/common/log.js';
import type { BlobTask } from '../../src/peer/blob-task.js';
import type { PeerStream, SchedulerClient } from '../../src/peer/swarm/scheduler-client.js';
import { SwarmDownload } from '../../src/peer/swarm/swarm-download.js';
import { ClusterToken } from '../../src/common/token.js';

// A blob verified while the peer shuts down announced itself on a scheduler channel closed
// meanwhile: grpc-js throws from createCall, and the rejection ended `starling up` with a crash
// instead of exit code 0. These drive SwarmDownload's scheduler stream with a stand-in client.

const DIGEST = `sha256:${'ab'.repeat(32)}`;

/** The few BlobTask members a download reads before it has parents: a whole blob of 2 pieces. */
function wholeTask(): BlobTask {
  return {
    digest: DIGEST,
    size: 8 << 20,
    layout: { pieceCount: 2, pieceSize: 4 << 20 },
    hasPiece: () => true,
    blob: { sources: [] },
    streamingReaders: 0,
  } as unknown as BlobTask;
}

interface StandIn {
  client: SchedulerClient;
  opened: string[];
  written: Array<{ address: string; packet: string }>;
}

/** A scheduler client over `addresses`; `onReady` runs while ready() is awaited (where the real race was). */
function standInClient(addresses: string[], refuse: Set<string>, onReady: (state: { closed: boolean }) => void): StandIn {
  const opened: string[] = [];
  const written: StandIn['written'] = [];
  const state = { closed: false };
  const client = {
    get closed() {
      return state.closed;
    },
    schedulersFor: () => addresses,
    ready: async () => {
      onReady(state);
      return true;
    },
    markUnhealthy: () => undefined,
    openStream: (address: string): PeerStream => {
      opened.push(address);
      if (state.closed || refuse.has(address)) throw new Error('Channel has been shut down');
      const stream = Object.assign(new EventEmitter(), {
        write: (packet: { packet: string }) => written.push({ address, packet: packet.packet }),
        end: () => undefined,
      });
      return stream as unknown as PeerStream;
    },
  };
  return { client: client as unknown as SchedulerClient, opened, written };
}

function download(client: SchedulerClient, dispatcher: Agent): SwarmDownload {
  const settings = {
    hostId: 'h1',
    clusterToken: ClusterToken.of('a-token-of-16-chars'),
    parallelism: 4,
    perParent: 1,
    pieceTimeoutMs: 5_000,
    stallMs: 5_000,
  };
  return new SwarmDownload(wholeTask(), client, dispatcher, settings, silentLogger, () => undefined);
}

/** Lets the download's connect attempt run its awaits. */
const settle = () => new Promise((resolve) => setImmediate(resolve));

describe('a swarm download while the peer shuts down', () => {
  it('opens no stream once the scheduler client is closed, and nothing is thrown', async () => {
    const dispatcher = new Agent();
    const rejections: unknown[] = [];
    const onRejection = (reason: unknown) => rejections.push(reason);
    process.on('unhandledRejection', onRejection);
    try {
      const standIn = standInClient(['10.0.0.1:8002'], new Set(), (state) => (state.closed = true));
      const d = download(standIn.client, dispatcher);
      d.announceHolding();
      await settle();
      await settle();
      assert.deepEqual(standIn.opened, []);
      assert.deepEqual(rejections, []);
      d.close('test over');
    } finally {
      process.off('unhandledRejection', onRejection);
      await dispatcher.close();
    }
  });

  it('moves to the next scheduler when opening a stream on one throws', async () => {
    const dispatcher = new Agent();
    try {
      const standIn = standInClient(['10.0.0.1:8002', '10.0.0.2:8002'], new Set(['10.0.0.1:8002']), () => undefined);
      const d = download(standIn.client, dispatcher);
      d.announceHolding();
      await settle();
      await settle();
      assert.deepEqual(standIn.opened, ['10.0.0.1:8002', '10.0.0.2:8002']);
      assert.deepEqual(
        standIn.written.map((w) => `${w.address} ${w.packet}`),
        ['10.0.0.2:8002 register', '10.0.0.2:8002 downloadFinished'],
      );
      d.close('test over');
    } finally {
      await dispatcher.close();
    }
  });
});
