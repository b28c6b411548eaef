import type { ServerResponse } from 'node:http';
import { Registry, collectDefaultMetrics } from 'prom-client';
import { errorMessage } from './errors.js';

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

/**
 * Answers a Prometheus scrape of `registry` on a node:http server (the peer's mirror, the
 * snapshotter's and the scheduler's metrics ports; the manager's goes through its REST routes).
 * A collector that fails gives a 500 naming why; the promise never rejects.
 */
export async function serveMetrics(registry: Registry, res: ServerResponse): Promise<void> {
  try {
    const body = await registry.metrics();
    res.writeHead(200, { 'content-type': registry.contentType }).end(body);
  } catch (error) {
    res.writeHead(500, { 'content-type': 'text/plain' }).end(`metrics failed: ${errorMessage(error)}\n`);
  }
}
