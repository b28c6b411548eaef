import type { JobState, State } from '../api';

export function StateBadge({ state }: { state: State | JobState }) {
  return <span className={`badge state-${state}`}>{state}</span>;
}

export function TypeBadge({ type }: { type: 'normal' | 'seed' }) {
  return type === 'seed' ? <span className="badge seed">seed</span> : <span className="badge">peer</span>;
}

export function Labels({ labels }: { labels: Record<string, string> }) {
  const entries = Object.entries(labels).sort(([a], [b]) => a.localeCompare(b));
  if (!entries.length) return <span className="muted">none</span>;
  return (
    <ul className="labels">
      {entries.map(([key, value]) => (
        <li key={key} className="label">
          {key}={value}
        </li>
      ))}
    </ul>
  );
}
