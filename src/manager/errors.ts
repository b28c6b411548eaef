/**
 * A refusal the API turns into `{error: {code, message}}` with this HTTP status. Services throw
 * it so each rule is stated once, where it is checked.
 */
export class ManagerError extends Error {
  override name = 'ManagerError';
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

export const notFound = (what: string) => new ManagerError(404, 'not_found', `${what} does not exist`);
