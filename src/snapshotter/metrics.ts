// Prometheus metrics of the snapshotter: per mounted remote layer, what was fetched against its
// size (the lazy-pulling figure users ask for), and cache hits and verification failures.
import { Gauge, type Registry } from 'prom-client';
import type { LayerMounter, MountedLayer } from './remote-layers.js';

export function registerSnapshotterMetrics(registry: Registry, mounter: LayerMounter): void {
  const labelNames = ['digest'] as const;
  const perLayer = (name: string, help: string, value: (l: MountedLayer) => number) =>
    new Gauge({
      name,
      help,
      labelNames,
      registers: [registry],
      async collect() {
        this.reset();
        for (const layer of await mounter.layers().catch(() => [])) this.set({ digest: layer.source.digest }, value(layer));
      },
    });
  perLayer('starling_snapshotter_layer_size_bytes', 'Size of each mounted remote layer blob', (l) => l.size);
  perLayer(
    'starling_snapshotter_layer_fetched_bytes',
    'Bytes of each mounted layer fetched through the peer since it was mounted (footer, TOC, chunks)',
    (l) => l.stats.sourceBytes,
  );
  perLayer('starling_snapshotter_layer_cache_hits', 'Chunk reads of each mounted layer answered from its cache', (l) => l.stats.cacheHits);
  perLayer(
    'starling_snapshotter_layer_chunks_missing',
    'Distinct chunks of each mounted layer not cached on this node yet (0: the node holds the whole layer)',
    (l) => l.stats.chunksMissing,
  );
  perLayer(
    'starling_snapshotter_layer_digest_mismatches',
    'Chunks of each mounted layer whose bytes did not match the TOC',
    (l) => l.stats.digestMismatches,
  );
  new Gauge({
    name: 'starling_snapshotter_remote_layers',
    help: 'Remote layers mounted and served alive',
    registers: [registry],
    async collect() {
      this.set((await mounter.layers().catch(() => [])).length);
    },
  });
}
