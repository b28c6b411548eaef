import { Registry, collectDefaultMetrics } from 'prom-client';

/**
 * Event-loop delay sampling interval for the default metrics. prom-client's default (10 ms)
 * wakes every process 100 times a second even when it has nothing to do; with dozens of peers
 * on one host that idle wake-up cost alone showed up as a large share of a core.
 */
const EVENT_LOOP_SAMPLING_MS = 200;

/** One Prometheus registry per process, with Node's default process metrics. */
export function createMetricsRegistry(prefix = 'starling_'): Registry {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix, eventLoopMonitoringPrecision: EVENT_LOOP_SAMPLING_MS });
  return registry;
}
