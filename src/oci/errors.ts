/** OCI distribution error codes (distribution-spec, "Error Codes") and their usual HTTP status. */
export const OciErrorCode = {
  BLOB_UNKNOWN: 404,
  BLOB_UPLOAD_INVALID: 400,
  DIGEST_INVALID: 400,
  MANIFEST_UNKNOWN: 404,
  MANIFEST_INVALID: 400,
  NAME_INVALID: 400,
  NAME_UNKNOWN: 404,
  RANGE_INVALID: 416,
  SIZE_INVALID: 400,
  UNAUTHORIZED: 401,
  DENIED: 403,
  UNSUPPORTED: 405,
  TOOMANYREQUESTS: 429,
  // Not in the spec's table, but used by registries for upstream trouble.
  UNAVAILABLE: 502,
} as const;
export type OciErrorCodeName = keyof typeof OciErrorCode;

/** An error that the mirror answers with an OCI error JSON body. */
export class OciError extends Error {
  override name = 'OciError';
  readonly status: number;
  constructor(
    readonly code: OciErrorCodeName,
    message: string,
    options: { status?: number; detail?: unknown; headers?: Record<string, string> } = {},
  ) {
    super(message);
    this.status = options.status ?? OciErrorCode[code];
    this.detail = options.detail;
    this.headers = options.headers ?? {};
  }
  readonly detail: unknown;
  readonly headers: Record<string, string>;

  toJSON(): { errors: Array<{ code: string; message: string; detail?: unknown }> } {
    return { errors: [{ code: this.code, message: this.message, ...(this.detail === undefined ? {} : { detail: this.detail }) }] };
  }
}
