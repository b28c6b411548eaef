import { ApiError } from '../api';

/** An error as the manager worded it, announced to screen readers. */
export function ErrorMessage({ error }: { error: unknown }) {
  if (!error) return null;
  const message = messageOf(error);
  const status = error instanceof ApiError && error.status ? ` (HTTP ${error.status})` : '';
  return (
    <p role="alert" className="error">
      {message}
      {status && <span className="muted">{status}</span>}
    </p>
  );
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
