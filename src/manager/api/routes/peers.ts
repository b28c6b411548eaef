import { z } from 'zod';
import type { ApiDeps } from '../deps.js';
import { route, type Route } from '../route.js';
import { PEER_KEEPALIVE_PATH, peerKeepaliveSchema } from '../../../rpc/manager-api.js';
import { limitQuery, peerKeepaliveAnswer, peerQuery, peerSchema, taskSchema } from '../schemas.js';
import { listPeers, listTasks, peerKeepalive } from '../../services/members.js';

export function peerRoutes({ db, livenessMs }: ApiDeps): Route[] {
  return [
    route({
      method: 'GET',
      url: '/api/v1/peers',
      tag: 'peers',
      access: 'user',
      summary: 'List peers and seed peers with labels, health and what they hold',
      query: peerQuery,
      response: z.array(peerSchema),
      handler: ({ query }) => listPeers(db, query),
    }),
    route({
      method: 'POST',
      url: PEER_KEEPALIVE_PATH,
      tag: 'peers',
      access: 'cluster',
      summary: 'A peer registers or refreshes itself (every 5 s), reports its tasks, and gets the active schedulers of its cluster',
      body: peerKeepaliveSchema,
      response: peerKeepaliveAnswer,
      // One entry per blob the peer holds: a big cache reports a few MiB.
      bodyLimit: 16 * 1024 * 1024,
      handler: ({ body }) => peerKeepalive(db, body, livenessMs),
    }),
    route({
      method: 'GET',
      url: '/api/v1/tasks',
      tag: 'peers',
      access: 'user',
      summary: 'Tasks (blobs) the peers hold, who holds them, and where their bytes came from',
      query: limitQuery,
      response: z.array(taskSchema),
      handler: ({ query }) => listTasks(db, query.limit),
    }),
  ];
}
