import { useMutation, useQuery, useQueryClient } from '@tanstack/react-query';
import { useState, type FormEvent } from 'react';
import { useNavigate } from 'react-router';
import { api, type PreheatRequest } from '../api';
import { ErrorMessage } from './ErrorMessage';

interface Fields {
  image: string;
  platform: string;
  scope: 'seeds' | 'all-peers' | 'zone';
  zone: string;
  username: string;
  password: string;
  insecure: boolean;
}

const EMPTY: Fields = { image: '', platform: 'linux/amd64', scope: 'seeds', zone: '', username: '', password: '', insecure: false };

function toPreheatRequest(fields: Fields): PreheatRequest {
  const body: PreheatRequest = {
    type: 'preheat',
    image: fields.image.trim(),
    platform: fields.platform.trim(),
    scope: fields.scope === 'zone' ? `zone:${fields.zone.trim()}` : fields.scope,
  };
  if (fields.username) body.credentials = { username: fields.username, password: fields.password };
  if (fields.insecure) body.insecure = true;
  return body;
}

/** Starts a preheat (POST /jobs) and opens the new job; the manager's refusal is shown as it worded it. */
export function PreheatForm() {
  const client = useQueryClient();
  const navigate = useNavigate();
  const [fields, setFields] = useState<Fields>(EMPTY);
  const set = <K extends keyof Fields>(key: K, value: Fields[K]) => setFields((current) => ({ ...current, [key]: value }));
  // Zones the peers report, offered for the zone scope.
  const peers = useQuery({ queryKey: ['peers', '', ''], queryFn: () => api.peers() });
  const zones = [...new Set((peers.data ?? []).map((p) => p.labels.zone).filter((z): z is string => Boolean(z)))].sort();

  const start = useMutation({
    mutationFn: api.createPreheat,
    onSuccess: (job) => {
      void client.invalidateQueries({ queryKey: ['jobs'] });
      void client.invalidateQueries({ queryKey: ['overview'] });
      void navigate(`/jobs/${job.id}`); // the router shows a failed navigation itself
    },
  });
  const submit = (event: FormEvent) => {
    event.preventDefault();
    start.mutate(toPreheatRequest(fields));
  };

  return (
    <form className="panel form" onSubmit={submit} aria-labelledby="preheat-title">
      <h2 id="preheat-title">Start a preheat</h2>
      <label>
        Image
        <input
          required
          value={fields.image}
          onChange={(e) => set('image', e.target.value)}
          placeholder="registry.example.com/team/app:v1"
        />
      </label>
      <label>
        Platform
        <input required value={fields.platform} onChange={(e) => set('platform', e.target.value)} />
      </label>
      <label>
        Scope
        <select value={fields.scope} onChange={(e) => set('scope', e.target.value as Fields['scope'])}>
          <option value="seeds">seed peers</option>
          <option value="all-peers">all peers</option>
          <option value="zone">peers in a zone</option>
        </select>
      </label>
      {fields.scope === 'zone' && (
        <label>
          Zone
          <input required list="zones" value={fields.zone} onChange={(e) => set('zone', e.target.value)} />
          <datalist id="zones">
            {zones.map((zone) => (
              <option key={zone} value={zone} />
            ))}
          </datalist>
        </label>
      )}
      <details>
        <summary>Registry access (optional)</summary>
        <label>
          Username
          <input autoComplete="off" value={fields.username} onChange={(e) => set('username', e.target.value)} />
        </label>
        <label>
          Password
          <input type="password" autoComplete="off" value={fields.password} onChange={(e) => set('password', e.target.value)} />
        </label>
        <label className="check">
          <input type="checkbox" checked={fields.insecure} onChange={(e) => set('insecure', e.target.checked)} />
          Reach the registry over plain HTTP
        </label>
      </details>
      <button type="submit" disabled={start.isPending}>
        {start.isPending ? 'Resolving the image…' : 'Start preheat'}
      </button>
      <ErrorMessage error={start.error} />
    </form>
  );
}
