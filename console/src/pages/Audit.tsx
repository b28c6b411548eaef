import { useInfiniteQuery } from '@tanstack/react-query';
import { useState, type FormEvent } from 'react';
import { api } from '../api';
import { ErrorMessage } from '../components/ErrorMessage';
import { dateTime } from '../format';

const PAGE = 50;

/** Every change, newest first, by whom; filter by action or actor, page backwards. */
export function Audit() {
  const [draft, setDraft] = useState({ action: '', actor: '' });
  const [filter, setFilter] = useState(draft);
  const audit = useInfiniteQuery({
    queryKey: ['audit', filter],
    queryFn: ({ pageParam }) => api.audit({ ...filter, before: pageParam, limit: PAGE }),
    initialPageParam: undefined as number | undefined,
    getNextPageParam: (last) => (last.length === PAGE ? last.at(-1)?.id : undefined),
  });
  const entries = audit.data?.pages.flat() ?? [];
  const apply = (event: FormEvent) => {
    event.preventDefault();
    setFilter({ action: draft.action.trim(), actor: draft.actor.trim() });
  };
  return (
    <>
      <h1>Audit log</h1>
      <form className="filters" onSubmit={apply}>
        <label>
          Action
          <input value={draft.action} onChange={(e) => setDraft({ ...draft, action: e.target.value })} placeholder="job.create" />
        </label>
        <label>
          Actor
          <input value={draft.actor} onChange={(e) => setDraft({ ...draft, actor: e.target.value })} placeholder="user:admin" />
        </label>
        <button type="submit">Filter</button>
      </form>
      <ErrorMessage error={audit.error} />
      {audit.isPending && <p className="loading">Loading…</p>}
      {audit.isSuccess && entries.length === 0 && (
        <p className="muted">Nothing recorded{filter.action || filter.actor ? ' that matches' : ''}.</p>
      )}
      {entries.length > 0 && (
        <table aria-label="audit log">
          <thead>
            <tr>
              <th>When</th>
              <th>Actor</th>
              <th>Action</th>
              <th>Target</th>
              <th>Detail</th>
            </tr>
          </thead>
          <tbody>
            {entries.map((entry) => (
              <tr key={entry.id}>
                <td>{dateTime(entry.at)}</td>
                <td>{entry.actor}</td>
                <td>
                  <code>{entry.action}</code>
                </td>
                <td>{entry.target}</td>
                <td className="detail">{Object.keys(entry.detail).length ? JSON.stringify(entry.detail) : ''}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {audit.hasNextPage && (
        <button type="button" onClick={() => void audit.fetchNextPage()} disabled={audit.isFetchingNextPage}>
          Older entries
        </button>
      )}
    </>
  );
}
