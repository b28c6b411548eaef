// The background fetch yields to on-demand work of the whole node, not only of its own layer: with
// several layers mounted one after the other (as containerd prepares an image's layers), the first
// layers' background fetches must not compete with the mounts of the next ones.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileSource, type RangeSource } from '../../src/estargz/index.js';
import { ChunkFetcher } from '../../src/lazy/chunk-fetcher.js';
import { ChunkStore } from '../../src/lazy/chunk-store.js';
import { FetchPriority, mountLazyLayer, type LazyLayer } from '../../src/lazy/index.js';
import { makeTempDir, type TempDir } from '../fixtures/processes.js';
import { buildLayer, layerEntries, type BuiltLayer } from './layer-fixture.js';
import { makeTar } from '../fixtures/tar.js';

/** A file source that counts its reads and can be held: reads wait while `held` is set. */
async function observedSource(file: string) {
  const inner = await fileSource(file);
  let release: () => void = () => {};
  let gate: Promise<void> | undefined;
  const source: RangeSource & { reads: number; hold(): void; release(): void; close(): Promise<void> } = {
    size: inner.size,
    reads: 0,
    async read(offset, length) {
      source.reads++;
      await gate;
      return inner.read(offset, length);
    },
    hold() {
      gate = new Promise((resolve) => (release = resolve));
    },
    release() {
      gate = undefined;
      release();
    },
    close: () => inner.close(),
  };
  return source;
}

describe("background fetch and the node's other layers", () => {
  let tmp: TempDir;
  let built: BuiltLayer;
  const mounts: LazyLayer[] = [];

  before(async () => {
    tmp = await makeTempDir('starling-bg-priority-');
    built = await buildLayer(tmp.path, 'layer', await makeTar(layerEntries(3 * 1024 * 1024)), 0);
  });

  after(async () => {
    for (const layer of mounts) await layer.unmount({ lazy: true }).catch(() => {});
    await built?.close();
    await tmp?.remove();
  });

  const mount = async (name: string, source: RangeSource, priority: FetchPriority, spanBytes?: number) => {
    const mountpoint = path.join(tmp.path, `mnt-${name}`);
    fs.mkdirSync(mountpoint);
    const layer = await mountLazyLayer({
      source,
      tocDigest: built.result.tocDigest,
      mountpoint,
      cacheDir: path.join(tmp.path, `cache-${name}`),
      prefetch: true,
      backgroundFetch: { enabled: true, concurrency: 2, idleMs: 20, spanBytes },
      priority,
    });
    mounts.push(layer);
    return layer;
  };

  test('a mounted layer fetches nothing in the background while another layer of the node is being mounted', async () => {
    const priority = new FetchPriority({ backgroundSlots: 2, quietMs: 20 });
    // The second layer is mounted first and held in the middle of its mount (footer and TOC asked for, not answered)...
    const second = await observedSource(built.blobPath);
    second.hold();
    const secondMount = mount('second', second, priority);
    await waitUntil(() => second.reads > 0);
    // ...while the first one is mounted and would start its background fetch 20 ms later.
    const first = await observedSource(built.blobPath);
    const firstLayer = await mount('first', first, priority);
    const readsAfterMount = first.reads;
    await new Promise((resolve) => setTimeout(resolve, 400));
    assert.equal(first.reads, readsAfterMount, 'no background request while the other layer mounts');
    assert.ok(firstLayer.stats().chunksMissing > 0, 'the first layer is not whole yet');

    second.release();
    await secondMount;
    await firstLayer.backgroundDone;
    assert.ok(first.reads > readsAfterMount, 'the background fetch ran once the other mount was over');
    assert.equal(firstLayer.stats().chunksMissing, 0, 'and brought the whole layer');
    await first.close();
    await second.close();
  });

  test('background requests of all layers sharing a priority stay within its slots', async () => {
    const priority = new FetchPriority({ backgroundSlots: 1, quietMs: 0 });
    let inFlight = 0;
    let most = 0;
    const tracked = async (name: string) => {
      const inner = await observedSource(built.blobPath);
      const source: RangeSource = {
        size: inner.size,
        async read(offset, length) {
          inFlight++;
          most = Math.max(most, inFlight);
          try {
            await new Promise((resolve) => setTimeout(resolve, 5));
            return await inner.read(offset, length);
          } finally {
            inFlight--;
          }
        },
      };
      // Counted from here on: the mounts' own reads are on-demand work.
      // Small spans: many background requests per layer, two workers each.
      const layer = await mount(name, source, priority, 256 * 1024);
      return { layer, inner };
    };
    const layers = [await tracked('slots-a'), await tracked('slots-b'), await tracked('slots-c')];
    most = 0;
    await Promise.all(layers.map((l) => l.layer.backgroundDone ?? assert.fail('background fetch is on')));
    for (const { layer, inner } of layers) {
      assert.equal(layer.stats().chunksMissing, 0);
      await inner.close();
    }
    assert.equal(most, 1, 'one background request at a time for the three layers together');
  });

  test('a read a workload waits for does not wait on a background fetch of its chunk: it asks again, marked on demand', async () => {
    const file = await fileSource(built.blobPath);
    const priorities: string[] = [];
    let releaseBackground: () => void = () => {};
    const backgroundHeld = new Promise<void>((resolve) => (releaseBackground = resolve));
    const source: RangeSource = {
      size: file.size,
      async read(offset, length, priority = 'demand') {
        priorities.push(priority);
        if (priority === 'background') await backgroundHeld; // as a seed putting it off
        return file.read(offset, length);
      },
    };
    const chunk = built.reader.chunks[0];
    assert.ok(chunk, 'the layer has chunks');
    const store = await ChunkStore.open(path.join(tmp.path, 'overtake-store'), { memory: null });
    const fetcher = new ChunkFetcher(source, store, built.reader.format);
    const background = fetcher.fill([chunk], 'background');
    const [data] = await fetcher.ensure([chunk], 'demand');
    assert.equal(data?.length, chunk.chunkSize, 'the on-demand read came back while the background one is held');
    assert.deepEqual(priorities, ['background', 'demand']);
    releaseBackground();
    await background;
    await file.close();
  });
});

async function waitUntil(predicate: () => boolean): Promise<void> {
  while (!predicate()) await new Promise((resolve) => setTimeout(resolve, 5));
}
