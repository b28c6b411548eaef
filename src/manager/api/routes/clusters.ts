import { z } from 'zod';
import type { ApiDeps } from '../deps.js';
import { route, type Route } from '../route.js';
import { clusterConfigPatchBody, clusterSchema, createClusterBody, idParams, updateClusterBody } from '../schemas.js';
import { schedulingSchema } from '../../../scheduler/config.js';
import { createCluster, deleteCluster, getCluster, listClusters, updateCluster, updateClusterConfig } from '../../services/clusters.js';

export function clusterRoutes({ db }: ApiDeps): Route[] {
  return [
    route({
      method: 'GET',
      url: '/api/v1/clusters',
      tag: 'clusters',
      access: 'user',
      summary: 'List scheduler clusters',
      response: z.array(clusterSchema),
      handler: () => listClusters(db),
    }),
    route({
      method: 'POST',
      url: '/api/v1/clusters',
      tag: 'clusters',
      access: 'user',
      status: 201,
      summary: 'Create a scheduler cluster (settings default to the scheduler defaults)',
      body: createClusterBody,
      response: clusterSchema,
      handler: ({ body, actor }) => createCluster(db, actor, body),
    }),
    route({
      method: 'GET',
      url: '/api/v1/clusters/:id',
      tag: 'clusters',
      access: 'user',
      summary: 'Get a scheduler cluster',
      params: idParams,
      response: clusterSchema,
      handler: ({ params }) => getCluster(db, params.id),
    }),
    route({
      method: 'PATCH',
      url: '/api/v1/clusters/:id',
      tag: 'clusters',
      access: 'user',
      summary: 'Rename a cluster, change its scopes, or make it the default',
      params: idParams,
      body: updateClusterBody,
      response: clusterSchema,
      handler: ({ params, body, actor }) => updateCluster(db, actor, params.id, body),
    }),
    route({
      method: 'PATCH',
      url: '/api/v1/clusters/:id/config',
      tag: 'clusters',
      access: 'user',
      summary: "Change some of a cluster's scheduling settings; running schedulers apply them at their next keep-alive",
      params: idParams,
      body: clusterConfigPatchBody,
      docBody: schedulingSchema,
      response: clusterSchema,
      handler: ({ params, body, actor }) => updateClusterConfig(db, actor, params.id, body),
    }),
    route({
      method: 'DELETE',
      url: '/api/v1/clusters/:id',
      tag: 'clusters',
      access: 'user',
      status: 204,
      summary: 'Delete a cluster (not the default); its peers move to the default cluster',
      params: idParams,
      handler: ({ params, actor }) => deleteCluster(db, actor, params.id),
    }),
  ];
}
