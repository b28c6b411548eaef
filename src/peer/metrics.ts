import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import type { BlobStore } from '../storage/blob-store.js';
import type { OriginReadCounts } from './sources/origin-source.js';

/** The peer's Prometheus metrics; the first question users ask is answered by downloadedBytes{source}. */
export function createPeerMetrics(registry: Registry, store: () => BlobStore | undefined) {
  const registers = [registry];
  return {
    requests: new Counter({
      name: 'starling_peer_requests_total',
      help: 'Mirror requests by route, method and status',
      labelNames: ['route', 'method', 'status'] as const,
      registers,
    }),
    requestSeconds: new Histogram({
      name: 'starling_peer_request_duration_seconds',
      help: 'Time to answer a mirror request, until the last byte',
      labelNames: ['route'] as const,
      buckets: [0.001, 0.005, 0.02, 0.1, 0.5, 2, 10, 60, 300],
      registers,
    }),
    servedBytes: new Counter({
      name: 'starling_peer_served_bytes_total',
      help: 'Blob bytes sent to local clients',
      registers,
    }),
    sendfileBytes: new Counter({
      name: 'starling_peer_sendfile_bytes_total',
      help: 'Of the blob bytes sent to local clients, those sent from disk with sendfile(2)',
      registers,
    }),
    downloadedBytes: new Counter({
      name: 'starling_peer_downloaded_bytes_total',
      help: 'Blob bytes stored by this peer, by where they came from (origin, peer, seed)',
      labelNames: ['source'] as const,
      registers,
    }),
    uploadedBytes: new Counter({
      name: 'starling_peer_uploaded_bytes_total',
      help: 'Piece bytes sent to other peers',
      registers,
    }),
    uploadRequests: new Counter({
      name: 'starling_peer_upload_requests_total',
      help: 'Requests to the upload server by kind (piece, bitmap, seed, preheat, preheat-status) and outcome (sent, relayed, fetched from the origin for the child, put off (a background piece while children read on demand), busy, missing; accepted or refused for a seed or preheat trigger)',
      labelNames: ['kind', 'outcome'] as const,
      registers,
    }),
    parentsDropped: new Counter({
      name: 'starling_peer_parents_dropped_total',
      help: 'Parents this peer stopped using, by reason (bad piece, unreachable)',
      labelNames: ['reason'] as const,
      registers,
    }),
    blobRequests: new Counter({
      name: 'starling_peer_blob_requests_total',
      help: 'Blob requests by what the store already held: hit (complete), partial, miss',
      labelNames: ['cache'] as const,
      registers,
    }),
    verificationFailures: new Counter({
      name: 'starling_peer_blob_verification_failures_total',
      help: 'Blobs whose content did not match their digest and were discarded',
      registers,
    }),
    accessChecks: new Counter({
      name: 'starling_peer_access_checks_total',
      help: 'Checks that a client may read a cached blob: allowed or denied by its source registry, or foreign (the client names a registry that is no source of it, and is served from there)',
      labelNames: ['result'] as const,
      registers,
    }),
    unverifiedRangeBytes: new Counter({
      name: 'starling_peer_unverified_range_bytes_total',
      help: 'Bytes of range requests read again from the registry because the pieces stored for them were not verified yet',
      registers,
    }),
    spanBytes: new Counter({
      name: 'starling_peer_span_bytes_total',
      help: 'Bytes sent to lazy readers as parts of pieces read for them (spans), instead of the whole pieces around them',
      registers,
    }),
    evictedBytes: new Counter({
      name: 'starling_peer_evicted_bytes_total',
      help: 'Bytes evicted to stay within the disk quota',
      registers,
    }),
    originRequests: new Counter({
      name: 'starling_peer_origin_requests_total',
      help: 'Blob GETs this peer sent to origin registries: whole blobs, runs of pieces and spans',
      registers,
    }),
    originRangeIgnored: new Counter({
      name: 'starling_peer_origin_range_ignored_total',
      help: 'Range requests that an origin answered with the whole blob',
      registers,
    }),
    storageBytes: new Gauge({
      name: 'starling_peer_storage_bytes',
      help: 'Bytes of blob data on disk',
      registers,
      collect() {
        this.set(store()?.usedBytes ?? 0);
      },
    }),
    storageBlobs: new Gauge({
      name: 'starling_peer_storage_blobs',
      help: 'Blobs on disk, complete or partial',
      registers,
      collect() {
        this.set(store()?.blobCount ?? 0);
      },
    }),
  };
}

export type PeerMetrics = ReturnType<typeof createPeerMetrics>;

/** The counters an origin read bumps, for the mirror's and the swarm's reads alike. */
export function originReadCounts(metrics: PeerMetrics): OriginReadCounts {
  return { sent: () => metrics.originRequests.inc(), rangeIgnored: () => metrics.originRangeIgnored.inc() };
}
