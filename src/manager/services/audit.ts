import type { Kysely } from 'kysely';
import type { AuditRow, Database } from '../db/schema.js';

/** Who made a change: `user:<name>`, `scheduler:<ip:port>`, `peer:<hostId>` or `system`. */
export type Actor = string;

/** Records one change; callers pass their transaction so the change and its record land together. */
export async function recordAudit(
  db: Kysely<Database>,
  actor: Actor,
  action: string,
  target: string,
  detail: Record<string, unknown> = {},
): Promise<void> {
  await db
    .insertInto('audit_log')
    .values({ actor, action, target, detail: JSON.stringify(detail), at: Date.now() })
    .execute();
}

export interface AuditEntry {
  id: number;
  actor: string;
  action: string;
  target: string;
  detail: Record<string, unknown>;
  at: string;
}

export function toAuditEntry(row: AuditRow): AuditEntry {
  return {
    id: row.id,
    actor: row.actor,
    action: row.action,
    target: row.target,
    detail: JSON.parse(row.detail) as Record<string, unknown>,
    at: new Date(row.at).toISOString(),
  };
}

/** Newest first; `before` pages backwards by id. */
export async function listAudit(
  db: Kysely<Database>,
  filter: { limit: number; before?: number; action?: string; actor?: string },
): Promise<AuditEntry[]> {
  let query = db.selectFrom('audit_log').selectAll().orderBy('id', 'desc').limit(filter.limit);
  if (filter.before !== undefined) query = query.where('id', '<', filter.before);
  if (filter.action) query = query.where('action', '=', filter.action);
  if (filter.actor) query = query.where('actor', '=', filter.actor);
  return (await query.execute()).map(toAuditEntry);
}
