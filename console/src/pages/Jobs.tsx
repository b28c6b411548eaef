import { useQuery } from '@tanstack/react-query';
import { Link } from 'react-router';
import { api, type Job } from '../api';
import { Async } from '../components/Async';
import { StateBadge } from '../components/Badges';
import { ProgressBar } from '../components/Bars';
import { PreheatForm } from '../components/PreheatForm';
import { ago, dateTime } from '../format';
import { useSession } from '../session';

export const isActive = (job: Job) => job.state === 'pending' || job.state === 'running';

/** Preheat jobs, newest first; the list follows running jobs until they end. */
export function Jobs() {
  const { isAdmin } = useSession();
  const jobs = useQuery({
    queryKey: ['jobs'],
    queryFn: () => api.jobs(),
    refetchInterval: (query) => (query.state.data?.some(isActive) ? 1000 : 10_000),
  });
  return (
    <>
      <h1>Jobs</h1>
      {isAdmin ? <PreheatForm /> : <p className="muted">Your role may read only: starting a preheat needs an admin token.</p>}
      <h2>Recent jobs</h2>
      <Async query={jobs}>
        {(list) =>
          list.length === 0 ? (
            <p className="muted">No job yet.</p>
          ) : (
            <table aria-label="jobs">
              <thead>
                <tr>
                  <th>Job</th>
                  <th>Image</th>
                  <th>Scope</th>
                  <th>State</th>
                  <th>Progress</th>
                  <th>Started</th>
                  <th>By</th>
                </tr>
              </thead>
              <tbody>
                {list.map((job) => (
                  <tr key={job.id}>
                    <td>
                      <Link to={`/jobs/${job.id}`}>#{job.id}</Link>
                    </td>
                    <td>
                      <code>{job.args.image}</code>
                      <div className="muted">{job.args.platform}</div>
                    </td>
                    <td>{job.args.scope}</td>
                    <td>
                      <StateBadge state={job.state} />
                    </td>
                    <td>
                      <ProgressBar done={job.progress.bytes} total={job.progress.totalBytes} label={`job ${job.id} progress`} />
                    </td>
                    <td title={dateTime(job.createdAt)}>{ago(job.createdAt)}</td>
                    <td>{job.createdBy}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          )
        }
      </Async>
    </>
  );
}
