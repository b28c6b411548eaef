import { useMutation, useQuery, useQueryClient } from '@tanstack/react-query';
import { useState, type FormEvent } from 'react';
import { api, type Cluster, type ClusterConfig } from '../api';
import { Async } from '../components/Async';
import { ErrorMessage } from '../components/ErrorMessage';
import { ago } from '../format';
import { useSession } from '../session';

/** Scheduler clusters: which peers they serve (scopes) and how their schedulers pick parents. */
export function Clusters() {
  const clusters = useQuery({ queryKey: ['clusters'], queryFn: api.clusters });
  return (
    <>
      <h1>Clusters</h1>
      <Async query={clusters}>{(list) => list.map((cluster) => <ClusterPanel key={cluster.id} cluster={cluster} />)}</Async>
    </>
  );
}

function ClusterPanel({ cluster }: { cluster: Cluster }) {
  const { isAdmin } = useSession();
  const { config, scopes } = cluster;
  return (
    <section className="panel" aria-label={`cluster ${cluster.name}`}>
      <h2>
        {cluster.name} {cluster.isDefault && <span className="badge">default</span>}
      </h2>
      <p className="muted">
        Cluster {cluster.id}; settings version {cluster.configVersion}, changed {ago(cluster.updatedAt)}.
      </p>
      <div className="columns">
        <div>
          <h3>Serves peers by</h3>
          <dl className="pairs">
            <dt>zones</dt>
            <dd>{scopes.zones.join(', ') || '–'}</dd>
            <dt>CIDRs</dt>
            <dd>{scopes.cidrs.join(', ') || '–'}</dd>
            <dt>hostnames</dt>
            <dd>{scopes.hostnames.join(', ') || '–'}</dd>
          </dl>
        </div>
        <div>
          <h3>Scheduling</h3>
          <dl className="pairs">
            <dt>shape</dt>
            <dd>
              {config.shape === 'pipeline'
                ? `pipeline: ${config.pipeline.fanout} ${config.pipeline.fanout === 1 ? 'child' : 'children'} per node, ${config.pipeline.seedFanout} per seed`
                : config.shape}
            </dd>
            <dt>candidate parents</dt>
            <dd>{config.candidateParentLimit}</dd>
            <dt>back-to-source limit</dt>
            <dd>{config.backToSourceLimit}</dd>
            <dt>retry limit</dt>
            <dd>{config.retryLimit}</dd>
            <dt>slow factor</dt>
            <dd>{config.slowFactor}</dd>
            <dt>weights</dt>
            <dd>
              free upload {config.weights.freeUpload}, pieces {config.weights.pieces}, seed {config.weights.seed}, failure{' '}
              {config.weights.failure}
            </dd>
          </dl>
        </div>
        <div>
          <h3>Topology rules</h3>
          {config.topology.length === 0 ? (
            <p className="muted">none</p>
          ) : (
            <table>
              <thead>
                <tr>
                  <th>label</th>
                  <th>weight</th>
                  <th>strict</th>
                </tr>
              </thead>
              <tbody>
                {config.topology.map((rule) => (
                  <tr key={rule.key}>
                    <td>{rule.key}</td>
                    <td>{rule.weight}</td>
                    <td>{rule.strict ? 'yes: never crossed while a parent exists on this side' : 'no'}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          )}
        </div>
      </div>
      {isAdmin && <LimitsForm cluster={cluster} />}
    </section>
  );
}

type Limits = Pick<ClusterConfig, 'candidateParentLimit' | 'backToSourceLimit' | 'retryLimit'>;

const LIMITS: Array<{ key: keyof Limits; label: string }> = [
  { key: 'candidateParentLimit', label: 'Candidate parents' },
  { key: 'backToSourceLimit', label: 'Back-to-source limit' },
  { key: 'retryLimit', label: 'Retry limit' },
];

/** Changes the shape and the limits; running schedulers take them at their next keep-alive. */
function LimitsForm({ cluster }: { cluster: Cluster }) {
  const client = useQueryClient();
  const [values, setValues] = useState<Record<keyof Limits, string>>({
    candidateParentLimit: String(cluster.config.candidateParentLimit),
    backToSourceLimit: String(cluster.config.backToSourceLimit),
    retryLimit: String(cluster.config.retryLimit),
  });
  const [shape, setShape] = useState<ClusterConfig['shape']>(cluster.config.shape);
  const save = useMutation({
    mutationFn: (patch: Partial<ClusterConfig>) => api.updateClusterConfig(cluster.id, patch),
    onSuccess: () => client.invalidateQueries({ queryKey: ['clusters'] }),
  });
  const submit = (event: FormEvent) => {
    event.preventDefault();
    save.mutate({ shape, ...Object.fromEntries(LIMITS.map(({ key }) => [key, Number(values[key])])) });
  };
  return (
    <form className="inline-form" onSubmit={submit} aria-label={`change limits of ${cluster.name}`}>
      <label>
        Shape
        <select value={shape} onChange={(event) => setShape(event.target.value as ClusterConfig['shape'])}>
          <option value="adaptive">adaptive</option>
          <option value="mesh">mesh</option>
          <option value="pipeline">pipeline</option>
        </select>
      </label>
      {LIMITS.map(({ key, label }) => (
        <label key={key}>
          {label}
          <input type="number" value={values[key]} onChange={(event) => setValues({ ...values, [key]: event.target.value })} />
        </label>
      ))}
      <button type="submit" disabled={save.isPending}>
        Save limits
      </button>
      {save.isSuccess && <span className="ok">Saved; schedulers apply it at their next keep-alive.</span>}
      <ErrorMessage error={save.error} />
    </form>
  );
}
