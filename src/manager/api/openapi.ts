import { z } from 'zod';
import type { Route } from './route.js';
import { errorSchema } from './schemas.js';

/**
 * The OpenAPI 3.1 document, generated from the same route list and zod schemas that validate
 * requests, so it cannot drift from what the server accepts.
 */
export function openApiDocument(routes: Route[], version: string): Record<string, unknown> {
  const paths: Record<string, Record<string, unknown>> = {};
  for (const spec of routes) {
    const path = spec.url.replace(/:([A-Za-z]+)/g, '{$1}');
    const status = String(spec.status ?? 200);
    const responses: Record<string, unknown> = {
      [status]: spec.response
        ? { description: 'OK', content: { 'application/json': { schema: jsonSchema(spec.response, 'output') } } }
        : spec.produces
          ? { description: 'OK', content: { [spec.produces]: { schema: { type: 'string' } } } }
          : { description: 'Done, no content' },
    };
    const error = { content: { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } } };
    if (spec.body || spec.params || spec.query)
      responses['400'] = { description: 'Invalid request: the message names the field', ...error };
    if (spec.access !== 'public') responses['401'] = { description: 'Missing or invalid token', ...error };
    if (spec.access === 'user' && spec.method !== 'GET') responses['403'] = { description: 'The token’s role may only read', ...error };
    if (spec.params) responses['404'] = { description: 'No such object', ...error };
    if (spec.url === '/api/v1/jobs' && spec.method === 'POST') {
      responses['422'] = { description: 'Unknown image or platform, refused credentials, or no peer in scope', ...error };
      responses['502'] = { description: 'The registry could not be reached', ...error };
    }
    const operation: Record<string, unknown> = {
      operationId: operationId(spec),
      summary: spec.summary,
      tags: [spec.tag],
      parameters: [...parameters(spec.params, 'path'), ...parameters(spec.query, 'query')],
      responses,
    };
    if (spec.access === 'user') operation.security = [{ userToken: [] }];
    if (spec.access === 'cluster') operation.security = [{ clusterToken: [] }, {}];
    const body = spec.docBody ?? spec.body;
    if (body) operation.requestBody = { required: true, content: { 'application/json': { schema: jsonSchema(body, 'input') } } };
    (paths[path] ??= {})[spec.method.toLowerCase()] = operation;
  }
  return {
    openapi: '3.1.0',
    info: {
      title: 'Starling manager',
      version,
      description:
        'Control plane of Starling: scheduler clusters and their settings, schedulers and peers, preheat jobs, users, tokens and the audit log. ' +
        'Every /api/v1 route except the keep-alives needs a personal access token; read-only tokens may only GET.',
    },
    paths,
    components: {
      schemas: { Error: jsonSchema(errorSchema, 'output') },
      securitySchemes: {
        userToken: { type: 'http', scheme: 'bearer', description: 'Personal access token (POST /api/v1/tokens)' },
        clusterToken: {
          type: 'http',
          scheme: 'bearer',
          description: 'The cluster token shared by schedulers and peers (none needed when the manager has none)',
        },
      },
    },
  };
}

function jsonSchema(schema: z.ZodType, io: 'input' | 'output'): Record<string, unknown> {
  const out = z.toJSONSchema(schema, { io, unrepresentable: 'any' }) as Record<string, unknown>;
  delete out.$schema;
  return out;
}

function parameters(schema: z.ZodType | undefined, where: 'path' | 'query'): unknown[] {
  if (!schema) return [];
  const json = jsonSchema(schema, 'input') as { properties?: Record<string, unknown>; required?: string[] };
  return Object.entries(json.properties ?? {}).map(([name, property]) => ({
    name,
    in: where,
    required: where === 'path' || (json.required ?? []).includes(name),
    schema: property,
  }));
}

function operationId(spec: Route): string {
  const words = spec.url
    .replace(/^\/api\/v1\//, '')
    .split('/')
    .map((part) =>
      part.startsWith(':')
        ? 'By' + part.slice(1, 2).toUpperCase() + part.slice(2)
        : part.replace(/[^A-Za-z0-9]+(.)?/g, (_m, c: string | undefined) => (c ?? '').toUpperCase()),
    );
  const camel = words.map((w) => w.charAt(0).toUpperCase() + w.slice(1)).join('');
  return spec.method.toLowerCase() + camel;
}
