import { UserError } from '../common/errors.js';

/** What kind of problem an EstargzError reports; lets callers and tests tell cases apart. */
export type EstargzErrorCode =
  | 'FOOTER'
  | 'TOC'
  | 'TOC_DIGEST'
  | 'TOC_TOO_LARGE'
  | 'ENTRY'
  | 'UNSAFE_NAME'
  | 'DUPLICATE'
  | 'CHUNK'
  | 'CHUNK_DIGEST'
  | 'TAR'
  | 'GZIP'
  | 'ZSTD'
  | 'MISMATCH'
  | 'NOT_FOUND'
  | 'INPUT'
  | 'UNSUPPORTED';

/**
 * Every problem with an eStargz blob or with the tar fed to the writer. It is a UserError so the
 * CLI prints the message without a stack: the message names the problem and where it is.
 */
export class EstargzError extends UserError {
  override name = 'EstargzError';
  constructor(
    readonly code: EstargzErrorCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

export function wrapError(code: EstargzErrorCode, what: string, error: unknown): EstargzError {
  if (error instanceof EstargzError) return error;
  const detail = error instanceof Error ? error.message : String(error);
  return new EstargzError(code, `${what}: ${detail}`, { cause: error });
}
