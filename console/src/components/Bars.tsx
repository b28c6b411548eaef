import { bytes, percent } from '../format';

/** How far along: a bar and "done of total". */
export function ProgressBar({ done, total, label }: { done: number; total: number; label: string }) {
  const ratio = total > 0 ? Math.min(1, done / total) : 0;
  return (
    <div className="progress">
      <progress value={ratio} max={1} aria-label={label} />
      <span className="progress-text">
        {bytes(done)} of {bytes(total)} ({percent(ratio)})
      </span>
    </div>
  );
}

export interface Sources {
  peers: number;
  seeds: number;
  origin: number;
}

/** Where bytes came from: one stacked bar and its legend. */
export function SourcesBar({ sources }: { sources: Sources }) {
  const total = sources.peers + sources.seeds + sources.origin;
  const parts = [
    { key: 'peers', label: 'from peers', value: sources.peers },
    { key: 'seeds', label: 'from seeds', value: sources.seeds },
    { key: 'origin', label: 'from the origin', value: sources.origin },
  ];
  return (
    <div className="sources">
      <div className="sources-bar" aria-hidden="true">
        {total > 0 &&
          parts.map((part) => part.value > 0 && <span key={part.key} className={`source-${part.key}`} style={{ flexGrow: part.value }} />)}
      </div>
      <dl className="sources-legend">
        {parts.map((part) => (
          <div key={part.key}>
            <dt>
              <span className={`swatch source-${part.key}`} /> {part.label}
            </dt>
            <dd>{bytes(part.value)}</dd>
          </div>
        ))}
      </dl>
    </div>
  );
}
