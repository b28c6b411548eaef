import { useQuery } from '@tanstack/react-query';
import { api } from '../api';
import { Async } from '../components/Async';
import { StateBadge } from '../components/Badges';
import { ago, dateTime } from '../format';

export function Schedulers() {
  const schedulers = useQuery({ queryKey: ['schedulers'], queryFn: api.schedulers, refetchInterval: 5000 });
  const clusters = useQuery({ queryKey: ['clusters'], queryFn: api.clusters });
  const clusterName = (id: number) => clusters.data?.find((c) => c.id === id)?.name ?? `#${id}`;
  return (
    <>
      <h1>Schedulers</h1>
      <Async query={schedulers}>
        {(list) =>
          list.length === 0 ? (
            <p className="muted">
              No scheduler has registered yet (start one with <code>starling scheduler --manager URL</code>).
            </p>
          ) : (
            <table>
              <thead>
                <tr>
                  <th>Host</th>
                  <th>Address</th>
                  <th>Cluster</th>
                  <th>State</th>
                  <th>Last keep-alive</th>
                  <th>Registered</th>
                </tr>
              </thead>
              <tbody>
                {list.map((s) => (
                  <tr key={s.id}>
                    <td>{s.hostname}</td>
                    <td>
                      <code>{s.address}</code>
                    </td>
                    <td>{clusterName(s.clusterId)}</td>
                    <td>
                      <StateBadge state={s.state} />
                    </td>
                    <td title={dateTime(s.lastKeepalive)}>{ago(s.lastKeepalive)}</td>
                    <td>{dateTime(s.createdAt)}</td>
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
