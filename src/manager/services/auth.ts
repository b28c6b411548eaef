import { createHash, randomBytes } from 'node:crypto';
import type { Kysely } from 'kysely';
import type { Database, Role, TokenRow, UserRow } from '../db/schema.js';
import { ManagerError, notFound } from '../errors.js';
import { recordAudit, type Actor } from './audit.js';

/*
 * Personal access tokens: random, shown once, stored only as their sha256 (a leaked database
 * does not hand out working tokens). Each belongs to a user; the user's role decides what the
 * token may do.
 */

export interface Principal {
  userId: number;
  userName: string;
  role: Role;
  tokenId: number;
}

export function hashToken(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}

export function generateToken(): string {
  return `stl_${randomBytes(32).toString('base64url')}`;
}

/** The principal behind `Authorization: Bearer <token>`, or undefined for a missing, unknown or expired token. */
export async function authenticate(db: Kysely<Database>, header: string | undefined): Promise<Principal | undefined> {
  const [, token] = /^Bearer\s+(\S+)\s*$/i.exec(header ?? '') ?? [];
  if (token === undefined) return undefined;
  const row = await db
    .selectFrom('tokens')
    .innerJoin('users', 'users.id', 'tokens.user_id')
    .select([
      'tokens.id as tokenId',
      'tokens.expires_at as expiresAt',
      'users.id as userId',
      'users.name as userName',
      'users.role as role',
    ])
    .where('tokens.hash', '=', hashToken(token))
    .executeTakeFirst();
  if (!row || (row.expiresAt !== null && row.expiresAt <= Date.now())) return undefined;
  return { userId: row.userId, userName: row.userName, role: row.role, tokenId: row.tokenId };
}

export const actorOf = (principal: Principal): Actor => `user:${principal.userName}`;

export interface UserView {
  id: number;
  name: string;
  role: Role;
  createdAt: string;
}

const toUser = (row: UserRow): UserView => ({
  id: row.id,
  name: row.name,
  role: row.role,
  createdAt: new Date(row.created_at).toISOString(),
});

export async function listUsers(db: Kysely<Database>): Promise<UserView[]> {
  return (await db.selectFrom('users').selectAll().orderBy('id').execute()).map(toUser);
}

export async function getUser(db: Kysely<Database>, id: number): Promise<UserView> {
  const row = await db.selectFrom('users').selectAll().where('id', '=', id).executeTakeFirst();
  if (!row) throw notFound(`user ${id}`);
  return toUser(row);
}

export async function createUser(db: Kysely<Database>, actor: Actor, input: { name: string; role: Role }): Promise<UserView> {
  return db.transaction().execute(async (trx) => {
    const existing = await trx.selectFrom('users').select('id').where('name', '=', input.name).executeTakeFirst();
    if (existing) throw new ManagerError(409, 'conflict', `name: a user named "${input.name}" already exists`);
    const row = await trx
      .insertInto('users')
      .values({ name: input.name, role: input.role, created_at: Date.now() })
      .returningAll()
      .executeTakeFirstOrThrow();
    await recordAudit(trx, actor, 'user.create', `user:${row.id}`, { name: row.name, role: row.role });
    return toUser(row);
  });
}

export interface TokenView {
  id: number;
  userId: number;
  userName: string;
  name: string;
  createdAt: string;
  expiresAt: string | null;
}

const toToken = (row: TokenRow, userName: string): TokenView => ({
  id: row.id,
  userId: row.user_id,
  userName,
  name: row.name,
  createdAt: new Date(row.created_at).toISOString(),
  expiresAt: row.expires_at === null ? null : new Date(row.expires_at).toISOString(),
});

/** Creates a token; the returned `token` is the only time anyone sees it. */
export async function createToken(
  db: Kysely<Database>,
  actor: Actor,
  input: { userId: number; name: string; expiresInDays?: number },
): Promise<TokenView & { token: string }> {
  return db.transaction().execute(async (trx) => {
    const user = await trx.selectFrom('users').selectAll().where('id', '=', input.userId).executeTakeFirst();
    if (!user) throw new ManagerError(404, 'not_found', `userId: user ${input.userId} does not exist`);
    const token = generateToken();
    const now = Date.now();
    const row = await trx
      .insertInto('tokens')
      .values({
        user_id: user.id,
        name: input.name,
        hash: hashToken(token),
        created_at: now,
        expires_at: input.expiresInDays ? now + input.expiresInDays * 86_400_000 : null,
      })
      .returningAll()
      .executeTakeFirstOrThrow();
    await recordAudit(trx, actor, 'token.create', `token:${row.id}`, { user: user.name, name: row.name, expiresAt: row.expires_at });
    return { ...toToken(row, user.name), token };
  });
}

export async function listTokens(db: Kysely<Database>): Promise<TokenView[]> {
  const rows = await db
    .selectFrom('tokens')
    .innerJoin('users', 'users.id', 'tokens.user_id')
    .selectAll('tokens')
    .select('users.name as userName')
    .orderBy('tokens.id')
    .execute();
  return rows.map((row) => toToken(row, row.userName));
}

export async function revokeToken(db: Kysely<Database>, actor: Actor, id: number): Promise<void> {
  await db.transaction().execute(async (trx) => {
    const row = await trx.selectFrom('tokens').selectAll().where('id', '=', id).executeTakeFirst();
    if (!row) throw notFound(`token ${id}`);
    await trx.deleteFrom('tokens').where('id', '=', id).execute();
    await recordAudit(trx, actor, 'token.revoke', `token:${id}`, { name: row.name, userId: row.user_id });
  });
}

/**
 * At the first start (no users yet) creates the `admin` user with the given token, or a new one
 * that the caller prints once. Later starts leave users alone: a token revoked through the API
 * stays revoked. Returns the generated token, if one was generated.
 */
export async function bootstrapAdmin(
  db: Kysely<Database>,
  givenToken: string | undefined,
): Promise<{ generated?: string; givenTokenKnown: boolean }> {
  return db.transaction().execute(async (trx) => {
    const anyUser = await trx.selectFrom('users').select('id').limit(1).executeTakeFirst();
    if (anyUser) {
      const known = givenToken
        ? Boolean(await trx.selectFrom('tokens').select('id').where('hash', '=', hashToken(givenToken)).executeTakeFirst())
        : true;
      return { givenTokenKnown: known };
    }
    const token = givenToken ?? generateToken();
    const now = Date.now();
    const user = await trx
      .insertInto('users')
      .values({ name: 'admin', role: 'admin', created_at: now })
      .returningAll()
      .executeTakeFirstOrThrow();
    const row = await trx
      .insertInto('tokens')
      .values({ user_id: user.id, name: 'initial admin token', hash: hashToken(token), created_at: now, expires_at: null })
      .returning('id')
      .executeTakeFirstOrThrow();
    await recordAudit(trx, 'system', 'user.create', `user:${user.id}`, { name: 'admin', role: 'admin', initial: true });
    await recordAudit(trx, 'system', 'token.create', `token:${row.id}`, {
      user: 'admin',
      name: 'initial admin token',
      fromFile: givenToken !== undefined,
    });
    return { generated: givenToken ? undefined : token, givenTokenKnown: true };
  });
}
