import type { UseQueryResult } from '@tanstack/react-query';
import type { ReactNode } from 'react';
import { ErrorMessage } from './ErrorMessage';

/** Renders a query's data, or that it is loading, or why it failed. */
export function Async<T>({ query, children }: { query: UseQueryResult<T>; children: (data: T) => ReactNode }) {
  if (query.data !== undefined) {
    return (
      <>
        {query.error && <ErrorMessage error={query.error} />}
        {children(query.data)}
      </>
    );
  }
  if (query.error) return <ErrorMessage error={query.error} />;
  return <p className="loading">Loading…</p>;
}
