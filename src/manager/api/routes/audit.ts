import { z } from 'zod';
import type { ApiDeps } from '../deps.js';
import { route, type Route } from '../route.js';
import { auditQuery, auditSchema, overviewSchema } from '../schemas.js';
import { listAudit } from '../../services/audit.js';
import { overview } from '../../services/overview.js';

export function auditRoutes({ db }: ApiDeps): Route[] {
  return [
    route({
      method: 'GET',
      url: '/api/v1/audit',
      tag: 'audit',
      access: 'user',
      summary: 'Audit log, newest first (page with ?before=<id>)',
      query: auditQuery,
      response: z.array(auditSchema),
      handler: ({ query }) => listAudit(db, query),
    }),
    route({
      method: 'GET',
      url: '/api/v1/overview',
      tag: 'overview',
      access: 'user',
      summary: 'Counts, and bytes from peers versus the origin summed from peer reports ("is P2P working?")',
      response: overviewSchema,
      handler: () => overview(db),
    }),
  ];
}
