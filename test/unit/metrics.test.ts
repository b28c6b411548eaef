import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { describe, it } from 'node:test';
import { Counter, Gauge } from 'prom-client';
import { createMetricsRegistry, serveMetrics } from '../../src/common/metrics.js';

/** Scrapes `registry` through serveMetrics on a loopback server, as Prometheus would. */
async function scrape(registry: ReturnType<typeof createMetricsRegistry>): Promise<{ status: number; type: string; body: string }> {
  const server = http.createServer((_req, res) => void serveMetrics(registry, res));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    const response = await fetch(`http://127.0.0.1:${(server.address() as AddressInfo).port}/metrics`);
    return { status: response.status, type: response.headers.get('content-type') ?? '', body: await response.text() };
  } finally {
    await new Promise((resolve) => server.close(resolve));
  }
}

describe('the /metrics answer shared by the node:http servers', () => {
  it("answers a scrape with the registry's metrics and its content type", async () => {
    const registry = createMetricsRegistry();
    new Counter({ name: 'starling_test_pieces_total', help: 'pieces', registers: [registry] }).inc(3);
    const answer = await scrape(registry);
    assert.equal(answer.status, 200);
    assert.equal(answer.type, registry.contentType);
    assert.match(answer.body, /^starling_test_pieces_total 3$/m);
    assert.match(answer.body, /^starling_process_cpu_seconds_total /m); // the default process metrics
  });

  it('answers 500 naming the failure when a collector throws', async () => {
    const registry = createMetricsRegistry();
    new Gauge({
      name: 'starling_test_broken',
      help: 'a collector that fails',
      registers: [registry],
      collect() {
        throw new Error('database unreachable');
      },
    });
    const answer = await scrape(registry);
    assert.equal(answer.status, 500);
    assert.match(answer.body, /metrics failed: database unreachable/);
  });
});
