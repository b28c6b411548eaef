import { useQuery } from '@tanstack/react-query';
import { Link, useParams } from 'react-router';
import { api, type Job } from '../api';
import { Async } from '../components/Async';
import { StateBadge } from '../components/Badges';
import { ProgressBar } from '../components/Bars';
import { ErrorMessage } from '../components/ErrorMessage';
import { bytes, dateTime, shortDigest } from '../format';
import { isActive } from './Jobs';

/** One job: what it preheats, how far each layer is, and each (peer, layer) fetch. Polls while it runs. */
export function JobDetail() {
  const { id: idText } = useParams();
  const id = Number(idText);
  const job = useQuery({
    queryKey: ['job', id],
    queryFn: () => api.job(id),
    enabled: Number.isInteger(id) && id > 0,
    refetchInterval: (query) => (query.state.data && !isActive(query.state.data) ? false : 1000),
  });
  return (
    <>
      <p>
        <Link to="/jobs">← Jobs</Link>
      </p>
      <h1>Job #{idText}</h1>
      <Async query={job}>{(data) => <JobView job={data} />}</Async>
    </>
  );
}

function JobView({ job }: { job: Job }) {
  const { progress } = job;
  return (
    <>
      <section className="panel">
        <h2>
          {job.type} <StateBadge state={job.state} />
        </h2>
        <dl className="pairs">
          <dt>image</dt>
          <dd>
            <code>{job.args.image}</code>
          </dd>
          <dt>platform</dt>
          <dd>{job.args.platform}</dd>
          <dt>scope</dt>
          <dd>{job.args.scope}</dd>
          <dt>started by</dt>
          <dd>
            {job.createdBy}, {dateTime(job.createdAt)}
          </dd>
          <dt>run by</dt>
          <dd data-testid="job-owner">
            {job.owner ?? '–'}
            {job.takeovers > 0 && ` (taken over ${job.takeovers === 1 ? 'once' : `${job.takeovers} times`})`}
          </dd>
          <dt>fetches</dt>
          <dd data-testid="job-fetches">
            {progress.succeeded} of {progress.tasks} succeeded
            {progress.failed > 0 && `, ${progress.failed} failed`}
            {progress.running > 0 && `, ${progress.running} running`}
            {progress.pending > 0 && `, ${progress.pending} waiting`}
          </dd>
        </dl>
        <ProgressBar done={progress.bytes} total={progress.totalBytes} label="job progress" />
        {job.error && <ErrorMessage error={new Error(job.error)} />}
      </section>

      <h2>Layers</h2>
      <table aria-label="layers">
        <thead>
          <tr>
            <th>Layer</th>
            <th>Size</th>
            <th>Peers done</th>
            <th>Progress</th>
          </tr>
        </thead>
        <tbody>
          {job.layers.map((layer) => (
            <tr key={layer.digest}>
              <td title={layer.digest}>
                <code>{shortDigest(layer.digest)}</code>
              </td>
              <td>{bytes(layer.size)}</td>
              <td>
                {layer.succeeded} of {layer.peers}
                {layer.failed > 0 && <span className="error-text"> ({layer.failed} failed)</span>}
              </td>
              <td>
                <ProgressBar done={layer.bytes} total={layer.size * layer.peers} label={`layer ${shortDigest(layer.digest)} progress`} />
              </td>
            </tr>
          ))}
        </tbody>
      </table>

      {job.tasks && job.tasks.length > 0 && (
        <details>
          <summary>Each fetch ({job.tasks.length})</summary>
          <table aria-label="fetches">
            <thead>
              <tr>
                <th>Peer</th>
                <th>Layer</th>
                <th>State</th>
                <th>Bytes</th>
                <th>Problem</th>
              </tr>
            </thead>
            <tbody>
              {job.tasks.map((fetch) => (
                <tr key={`${fetch.hostId} ${fetch.digest}`}>
                  <td>
                    {fetch.hostId}
                    <div className="muted">{fetch.peerAddress}</div>
                  </td>
                  <td title={fetch.digest}>
                    <code>{shortDigest(fetch.digest)}</code>
                  </td>
                  <td>
                    <StateBadge state={fetch.state} />
                  </td>
                  <td>
                    {bytes(fetch.bytes)} of {bytes(fetch.size)}
                  </td>
                  <td>{fetch.error ?? ''}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </details>
      )}
    </>
  );
}
