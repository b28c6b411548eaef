import { z } from 'zod';
import type { ApiDeps } from '../deps.js';
import { route, type Route } from '../route.js';
import { SCHEDULER_KEEPALIVE_PATH, schedulerKeepaliveSchema } from '../../../rpc/manager-api.js';
import { schedulerKeepaliveAnswer, schedulerQuery, schedulerSchema } from '../schemas.js';
import { listSchedulers, schedulerKeepalive } from '../../services/members.js';

export function schedulerRoutes({ db }: ApiDeps): Route[] {
  return [
    route({
      method: 'GET',
      url: '/api/v1/schedulers',
      tag: 'schedulers',
      access: 'user',
      summary: 'List schedulers with their state and last keep-alive',
      query: schedulerQuery,
      response: z.array(schedulerSchema),
      handler: ({ query }) => listSchedulers(db, query),
    }),
    route({
      method: 'POST',
      url: SCHEDULER_KEEPALIVE_PATH,
      tag: 'schedulers',
      access: 'cluster',
      summary: "A scheduler registers or refreshes itself (every 5 s) and gets its cluster's scheduling settings",
      body: schedulerKeepaliveSchema,
      response: schedulerKeepaliveAnswer,
      handler: ({ body }) => schedulerKeepalive(db, body),
    }),
  ];
}
