import { z } from 'zod';
import type { ApiDeps } from '../deps.js';
import { route, type Route } from '../route.js';
import { idParams, jobQuery, jobSchema, preheatBody } from '../schemas.js';

export function jobRoutes({ jobs }: ApiDeps): Route[] {
  return [
    route({
      method: 'POST',
      url: '/api/v1/jobs',
      tag: 'jobs',
      access: 'user',
      status: 201,
      summary: 'Start a preheat: resolve the image for the platform, then have the peers in scope fetch every layer',
      body: preheatBody,
      response: jobSchema,
      handler: ({ body, actor }) => jobs.createPreheat(actor, body),
    }),
    route({
      method: 'GET',
      url: '/api/v1/jobs',
      tag: 'jobs',
      access: 'user',
      summary: 'List jobs, newest first, with their progress',
      query: jobQuery,
      response: z.array(jobSchema),
      handler: ({ query }) => jobs.list(query),
    }),
    route({
      method: 'GET',
      url: '/api/v1/jobs/:id',
      tag: 'jobs',
      access: 'user',
      summary: 'A job with per-layer progress and each (peer, layer) fetch',
      params: idParams,
      response: jobSchema,
      handler: ({ params }) => jobs.get(params.id),
    }),
  ];
}
