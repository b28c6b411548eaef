import { Registry, collectDefaultMetrics } from 'prom-client';

/** One Prometheus registry per process, with Node's default process metrics. */
export function createMetricsRegistry(prefix = 'starling_'): Registry {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix });
  return registry;
}
