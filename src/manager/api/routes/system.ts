import type { ApiDeps } from '../deps.js';
import { openApiDocument } from '../openapi.js';
import { route, type Route } from '../route.js';
import { z } from 'zod';

/** Health, Prometheus metrics and the OpenAPI document: readable without a token, change nothing. */
export function systemRoutes({ db, metrics }: ApiDeps, allRoutes: () => Route[], version: string): Route[] {
  return [
    route({
      method: 'GET', url: '/healthz', tag: 'system', access: 'public',
      summary: 'Liveness, including a database round trip',
      response: z.object({ ok: z.boolean() }),
      handler: async () => {
        await db.selectFrom('scheduler_clusters').select('id').limit(1).execute();
        return { ok: true };
      },
    }),
    route({
      method: 'GET', url: '/metrics', tag: 'system', access: 'public', produces: 'text/plain',
      summary: 'Prometheus metrics',
      handler: async ({ reply }) => {
        const text = await metrics.metrics();
        reply.header('content-type', metrics.contentType).send(text);
      },
    }),
    route({
      method: 'GET', url: '/api/v1/openapi.json', tag: 'system', access: 'public',
      summary: 'This API described in OpenAPI 3.1',
      response: z.record(z.string(), z.unknown()),
      handler: async () => openApiDocument(allRoutes(), version),
    }),
  ];
}
