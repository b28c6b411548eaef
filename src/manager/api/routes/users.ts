import { z } from 'zod';
import type { ApiDeps } from '../deps.js';
import { principalOf, route, type Route } from '../route.js';
import { createdTokenSchema, createTokenBody, createUserBody, idParams, meSchema, tokenSchema, userSchema } from '../schemas.js';
import { createToken, createUser, getUser, listTokens, listUsers, revokeToken } from '../../services/auth.js';

export function userRoutes({ db }: ApiDeps): Route[] {
  return [
    route({
      method: 'GET',
      url: '/api/v1/me',
      tag: 'users',
      access: 'user',
      summary: 'Who the presented token belongs to (the console logs in with it)',
      response: meSchema,
      handler: async (input) => {
        const { userId, tokenId } = principalOf(input);
        return { user: await getUser(db, userId), tokenId };
      },
    }),
    route({
      method: 'GET',
      url: '/api/v1/users',
      tag: 'users',
      access: 'user',
      summary: 'List users',
      response: z.array(userSchema),
      handler: () => listUsers(db),
    }),
    route({
      method: 'POST',
      url: '/api/v1/users',
      tag: 'users',
      access: 'user',
      status: 201,
      summary: 'Create a user with a role (admin or read-only); give it a token with POST /tokens',
      body: createUserBody,
      response: userSchema,
      handler: ({ body, actor }) => createUser(db, actor, body),
    }),
    route({
      method: 'GET',
      url: '/api/v1/tokens',
      tag: 'tokens',
      access: 'user',
      summary: 'List personal access tokens (never their values)',
      response: z.array(tokenSchema),
      handler: () => listTokens(db),
    }),
    route({
      method: 'POST',
      url: '/api/v1/tokens',
      tag: 'tokens',
      access: 'user',
      status: 201,
      summary: 'Create a personal access token for a user (default: the caller); the value is in this answer only',
      body: createTokenBody,
      response: createdTokenSchema,
      handler: (input) => createToken(db, input.actor, { ...input.body, userId: input.body.userId ?? principalOf(input).userId }),
    }),
    route({
      method: 'DELETE',
      url: '/api/v1/tokens/:id',
      tag: 'tokens',
      access: 'user',
      status: 204,
      summary: 'Revoke a token',
      params: idParams,
      handler: ({ params, actor }) => revokeToken(db, actor, params.id),
    }),
  ];
}
