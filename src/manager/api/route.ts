import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { ClusterToken } from '../../common/token.js';
import type { Kysely } from 'kysely';
import { z } from 'zod';
import type { Database } from '../db/schema.js';
import { ManagerError } from '../errors.js';
import type { Actor } from '../services/audit.js';
import { actorOf, authenticate, type Principal } from '../services/auth.js';
import { describeIssues } from '../services/clusters.js';

/**
 * Who may call a route:
 * - `public`: anyone (health, metrics, the OpenAPI document);
 * - `user`: a personal access token; GETs for every role, anything else for admins only;
 * - `cluster`: the cluster token schedulers and peers share.
 */
export type Access = 'public' | 'user' | 'cluster';

export type Method = 'GET' | 'POST' | 'PATCH' | 'DELETE';

type Shape = z.ZodType;

export interface RouteInput<P extends Shape, Q extends Shape, B extends Shape> {
  params: z.output<P>;
  query: z.output<Q>;
  body: z.output<B>;
  /** Set on `user` routes. */
  principal?: Principal;
  /** Who the audit log names. */
  actor: Actor;
  request: FastifyRequest;
  reply: FastifyReply;
}

export interface Route<P extends Shape = Shape, Q extends Shape = Shape, B extends Shape = Shape> {
  method: Method;
  url: string;
  summary: string;
  tag: string;
  access: Access;
  params?: P;
  query?: Q;
  body?: B;
  /** Shown in the OpenAPI document instead of `body` when validation happens deeper (cluster config). */
  docBody?: Shape;
  status?: number;
  response?: Shape;
  /** Non-JSON answers (metrics text, console files) document their media type here. */
  produces?: string;
  /** Largest body accepted, checked before it is read (default API_BODY_LIMIT). */
  bodyLimit?: number;
  handler(input: RouteInput<P, Q, B>): Promise<unknown>;
}

/** The caller of a `user` route, which its access check has found before the handler runs. */
export function principalOf(input: { principal?: Principal }): Principal {
  if (!input.principal)
    throw new ManagerError(401, 'unauthorized', 'a valid personal access token is required (Authorization: Bearer <token>)');
  return input.principal;
}

/** A route's path or query schema when it declares none. */
type NoFields = z.ZodObject<Record<never, never>>;

/** Keeps the handler's input typed by the route's own schemas. */
export function route<P extends Shape = NoFields, Q extends Shape = NoFields, B extends Shape = z.ZodUndefined>(
  spec: Route<P, Q, B>,
): Route {
  return spec;
}

export interface RouteContext {
  db: Kysely<Database>;
  clusterToken: ClusterToken;
}

/** Bodies larger than this are refused before a byte of them is read; a route may allow more. */
export const API_BODY_LIMIT = 1024 * 1024;

/** Who a request was found to be, before its body was read. */
const callers = new WeakMap<FastifyRequest, { principal?: Principal; actor: Actor }>();

export function registerRoute(app: FastifyInstance, ctx: RouteContext, spec: Route): void {
  app.route({
    method: spec.method,
    url: spec.url,
    bodyLimit: spec.bodyLimit ?? API_BODY_LIMIT,
    // Authentication comes before the body is read (a caller without a token costs no parsing) and
    // before validation (it learns nothing about the API's rules).
    onRequest: async (request) => {
      callers.set(request, await authenticateCaller(ctx, spec, request));
    },
    handler: async (request, reply) => {
      const { principal, actor } = callers.get(request) ?? { actor: 'anonymous' };
      const params = validate(spec.params ?? NOTHING, request.params ?? {}, 'path');
      const query = validate(spec.query ?? NOTHING, request.query ?? {}, 'query');
      const body = spec.body ? validate(spec.body, request.body, 'body') : undefined;
      const result = await spec.handler({ params, query, body, principal, actor, request, reply });
      if (reply.sent) return reply;
      reply.code(spec.status ?? 200);
      return result === undefined ? reply.send() : reply.send(result);
    },
  });
}

async function authenticateCaller(
  ctx: RouteContext,
  spec: Route,
  request: FastifyRequest,
): Promise<{ principal?: Principal; actor: Actor }> {
  if (spec.access === 'user') {
    const principal = await authenticate(ctx.db, request.headers.authorization);
    if (!principal)
      throw new ManagerError(401, 'unauthorized', 'a valid personal access token is required (Authorization: Bearer <token>)');
    if (spec.method !== 'GET' && principal.role !== 'admin') {
      throw new ManagerError(403, 'forbidden', `user ${principal.userName} has the ${principal.role} role, which may only read`);
    }
    return { principal, actor: actorOf(principal) };
  }
  if (spec.access === 'cluster' && !ctx.clusterToken.accepts(request.headers.authorization)) {
    throw new ManagerError(401, 'unauthorized', 'the cluster token is missing or wrong (Authorization: Bearer <cluster token>)');
  }
  return { actor: 'anonymous' };
}

/** What a route without query parameters accepts: none (an unknown one is a mistake worth naming). */
const NOTHING = z.object({}).strict();

function validate(schema: Shape | undefined, value: unknown, where: string): unknown {
  if (!schema) return {};
  if (where === 'body' && value === undefined) throw new ManagerError(400, 'invalid_request', 'body: a JSON body is required');
  const result = schema.safeParse(value);
  if (!result.success) throw new ManagerError(400, 'invalid_request', describeIssues(result.error, where));
  return result.data;
}
