/** Lazily fetched eStargz layers mounted through FUSE. */
export { mountLazyLayer, setReadAhead, type LazyLayer, type LazyLayerOptions, type LazyLayerStats, type MountTimings } from './mount.js';
export { HttpRangeSource, HttpRangeError, mirrorBlobUrl, type HttpRangeSourceOptions, type StreamingRangeSource, type FetchCounters } from './http-source.js';
export { ChunkStore, ChunkMemoryCache, sharedChunkMemory } from './chunk-store.js';
export { LayerTree, type LayerNode, type WhiteoutMode, DEFAULT_OPAQUE_XATTRS } from './layer-tree.js';
export type { BackgroundFetchOptions, BackgroundProgress } from './background.js';
export type { FetchStats } from './chunk-fetcher.js';
export type { PrefetchResult } from './prefetch.js';
