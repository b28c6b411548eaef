import type { ApiDeps } from '../deps.js';
import { openApiDocument } from '../openapi.js';
import { route, type Route } from '../route.js';
import { z } from 'zod';

/** Health, readiness, Prometheus metrics and the OpenAPI document: readable without a token, change nothing. */
export function systemRoutes({ metrics, readiness }: ApiDeps, allRoutes: () => Route[], version: string): Route[] {
  return [
    route({
      method: 'GET',
      url: '/healthz',
      tag: 'system',
      access: 'public',
      // No database round trip: an unreachable database makes every replica unready, and
      // restarting them all would not bring it back.
      summary: 'Liveness: the process answers',
      response: z.object({ ok: z.boolean() }),
      handler: async () => ({ ok: true }),
    }),
    route({
      method: 'GET',
      url: '/readyz',
      tag: 'system',
      access: 'public',
      summary: 'Readiness: 200 while the database answers and has the schema this replica needs, else 503 saying why',
      response: z.object({ ready: z.boolean(), replica: z.string(), reason: z.string().optional() }),
      handler: async ({ reply }) => {
        const answer = await readiness();
        reply.code(answer.ready ? 200 : 503);
        return reply.send(answer);
      },
    }),
    route({
      method: 'GET',
      url: '/metrics',
      tag: 'system',
      access: 'public',
      produces: 'text/plain',
      summary: 'Prometheus metrics',
      handler: async ({ reply }) => {
        const text = await metrics.metrics();
        reply.header('content-type', metrics.contentType).send(text);
      },
    }),
    route({
      method: 'GET',
      url: '/api/v1/openapi.json',
      tag: 'system',
      access: 'public',
      summary: 'This API described in OpenAPI 3.1',
      response: z.record(z.string(), z.unknown()),
      handler: async () => openApiDocument(allRoutes(), version),
    }),
  ];
}
