import { useQuery } from '@tanstack/react-query';
import { api, type Peer, type Task } from '../api';
import { Async } from '../components/Async';
import { SourcesBar } from '../components/Bars';
import { bytes, shortDigest } from '../format';

/** Blobs the peers hold, who holds them, and where their bytes came from. */
export function Tasks() {
  const tasks = useQuery({ queryKey: ['tasks'], queryFn: () => api.tasks(), refetchInterval: 5000 });
  const peers = useQuery({ queryKey: ['peers', '', ''], queryFn: () => api.peers(), refetchInterval: 5000 });
  return (
    <>
      <h1>Tasks</h1>
      {/* Both lists before the table: a row drawn without the peers would lack its seed badges. */}
      <Async query={peers}>
        {() => (
          <Async query={tasks}>
            {(list) =>
              list.length === 0 ? (
                <p className="muted">No peer holds a blob yet.</p>
              ) : (
                <>
                  <SourcesBar sources={totals(list)} />
                  <table aria-label="tasks">
                    <thead>
                      <tr>
                        <th>Blob</th>
                        <th>Size</th>
                        <th>Held by</th>
                        <th>From peers</th>
                        <th>From seeds</th>
                        <th>From origin</th>
                        <th title="bytes from the origin divided by the blob size">Origin copies</th>
                      </tr>
                    </thead>
                    <tbody>
                      {list.map((task) => (
                        <TaskRow key={task.digest} task={task} peers={peers.data ?? []} />
                      ))}
                    </tbody>
                  </table>
                </>
              )
            }
          </Async>
        )}
      </Async>
    </>
  );
}

function TaskRow({ task, peers }: { task: Task; peers: Peer[] }) {
  const kind = (hostId: string) => peers.find((p) => p.hostId === hostId)?.type;
  return (
    <tr>
      <td title={task.digest}>
        <code>{shortDigest(task.digest)}</code>
      </td>
      <td>{bytes(task.size)}</td>
      <td>
        <ul className="holders">
          {task.peers.map((holder) => (
            <li key={holder.hostId}>
              {holder.hostId}
              {kind(holder.hostId) === 'seed' && <span className="badge seed">seed</span>}
              {!holder.complete && <span className="muted"> (partial)</span>}
            </li>
          ))}
        </ul>
      </td>
      <td>{bytes(task.bytesFromPeers)}</td>
      <td>{bytes(task.bytesFromSeeds)}</td>
      <td>{bytes(task.bytesFromOrigin)}</td>
      <td>{task.size > 0 ? (task.bytesFromOrigin / task.size).toFixed(2) : '–'}</td>
    </tr>
  );
}

function totals(tasks: Task[]) {
  return tasks.reduce(
    (sum, t) => ({ peers: sum.peers + t.bytesFromPeers, seeds: sum.seeds + t.bytesFromSeeds, origin: sum.origin + t.bytesFromOrigin }),
    { peers: 0, seeds: 0, origin: 0 },
  );
}
