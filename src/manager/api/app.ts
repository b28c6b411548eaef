import Fastify, { LogController, type FastifyBaseLogger, type FastifyError, type FastifyInstance } from 'fastify';
import { createLimitedServer } from '../../common/http-server.js';
import type { Logger } from '../../common/log.js';
import { ManagerError } from '../errors.js';
import type { ManagerMetrics } from '../metrics.js';
import type { ApiDeps } from './deps.js';
import { API_BODY_LIMIT, registerRoute, type Route } from './route.js';
import { auditRoutes } from './routes/audit.js';
import { clusterRoutes } from './routes/clusters.js';
import { registerConsole } from './routes/console.js';
import { jobRoutes } from './routes/jobs.js';
import { peerRoutes } from './routes/peers.js';
import { schedulerRoutes } from './routes/schedulers.js';
import { systemRoutes } from './routes/system.js';
import { userRoutes } from './routes/users.js';

export const API_VERSION = '1.0.0';

/** Every route of the API, in one list: what is served and what the OpenAPI document describes. */
export function apiRoutes(deps: ApiDeps): Route[] {
  const routes: Route[] = [];
  routes.push(
    ...systemRoutes(deps, () => routes, API_VERSION),
    ...clusterRoutes(deps),
    ...schedulerRoutes(deps),
    ...peerRoutes(deps),
    ...userRoutes(deps),
    ...jobRoutes(deps),
    ...auditRoutes(deps),
  );
  return routes;
}

export function buildApi(deps: ApiDeps, metrics: ManagerMetrics, log: Logger): FastifyInstance {
  // Keep-alives arrive every few seconds from every peer: requests are counted, not logged.
  const loggerInstance: FastifyBaseLogger = log; // as Fastify's own type, or its instance type carries pino's
  const app = Fastify({
    loggerInstance,
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: API_BODY_LIMIT,
    // The limits every Starling port keeps (common/http-server.ts), and HTTPS when the cluster uses TLS.
    serverFactory: (handler) => createLimitedServer(handler, { what: 'manager', tls: deps.tls, log }),
  });

  app.setErrorHandler((error: FastifyError, request, reply) => {
    if (error instanceof ManagerError) return reply.code(error.status).send({ error: { code: error.code, message: error.message } });
    const status = error.statusCode ?? 500;
    if (status >= 400 && status < 500) {
      const message =
        error.code === 'FST_ERR_CTP_INVALID_JSON_BODY' || error instanceof SyntaxError
          ? `body: not valid JSON: ${error.message}`
          : error.message;
      return reply
        .code(status)
        .send({ error: { code: status === 415 ? 'unsupported_media_type' : status === 413 ? 'too_large' : 'invalid_request', message } });
    }
    log.error({ err: error.message, stack: error.stack, url: request.url }, 'request failed');
    return reply.code(500).send({ error: { code: 'internal', message: 'internal error (see the manager log)' } });
  });
  app.setNotFoundHandler((request, reply) => {
    reply.code(404).send({ error: { code: 'not_found', message: `no route ${request.method} ${request.url.split('?')[0]}` } });
  });
  app.addHook('onResponse', async (request, reply) => {
    metrics.requests.inc({ method: request.method, route: request.routeOptions.url ?? 'unmatched', status: String(reply.statusCode) });
  });

  const ctx = { db: deps.db, clusterToken: deps.clusterToken };
  for (const spec of apiRoutes(deps)) registerRoute(app, ctx, spec);
  registerConsole(app, deps.consoleDir);
  return app;
}
