/** Lazily fetched eStargz layers mounted through FUSE. */
export { mountLazyLayer, setReadAhead, type LazyLayer, type LazyLayerOptions } from './mount.js';
export { HttpRangeSource, mirrorBlobUrl } from './http-source.js';
export { prefetchLength } from './prefetch.js';
export { FetchPriority, type FetchPrioritySettings } from './fetch-priority.js';
