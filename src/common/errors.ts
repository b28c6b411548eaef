/** An error whose message is meant for the person who ran the command: printed without a stack. */
export class UserError extends Error {
  override name = 'UserError';
}

export function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
