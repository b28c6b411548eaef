import { useQuery } from '@tanstack/react-query';
import { useState } from 'react';
import { api } from '../api';
import { Async } from '../components/Async';
import { Labels, StateBadge, TypeBadge } from '../components/Badges';
import { bytes, dateTime, secondsAgo } from '../format';

/** Seeds and peers with their labels, health and what they hold. */
export function Peers() {
  const [type, setType] = useState('');
  const [state, setState] = useState('');
  const peers = useQuery({ queryKey: ['peers', type, state], queryFn: () => api.peers({ type, state }), refetchInterval: 5000 });
  const clusters = useQuery({ queryKey: ['clusters'], queryFn: api.clusters });
  const clusterName = (id: number) => clusters.data?.find((c) => c.id === id)?.name ?? `#${id}`;
  return (
    <>
      <h1>Peers</h1>
      <div className="filters">
        <label>
          Kind
          <select value={type} onChange={(event) => setType(event.target.value)}>
            <option value="">all</option>
            <option value="seed">seeds</option>
            <option value="normal">peers</option>
          </select>
        </label>
        <label>
          State
          <select value={state} onChange={(event) => setState(event.target.value)}>
            <option value="">all</option>
            <option value="active">active</option>
            <option value="inactive">inactive</option>
          </select>
        </label>
      </div>
      <Async query={peers}>
        {(list) =>
          list.length === 0 ? (
            <p className="muted">
              No peer matches (peers register with <code>starling peer --manager URL</code>).
            </p>
          ) : (
            <table aria-label="peers">
              <thead>
                <tr>
                  <th>Host</th>
                  <th>Kind</th>
                  <th>Upload address</th>
                  <th>Cluster</th>
                  <th>Labels</th>
                  <th>State</th>
                  <th>Last seen</th>
                  <th>Blobs held</th>
                  <th>From peers / seeds / origin</th>
                </tr>
              </thead>
              <tbody>
                {list.map((peer) => (
                  <tr key={peer.id}>
                    <td>
                      <strong>{peer.hostId}</strong>
                      <div className="muted">{peer.hostname}</div>
                    </td>
                    <td>
                      <TypeBadge type={peer.type} />
                    </td>
                    <td>
                      <code>
                        {peer.ip}:{peer.uploadPort}
                      </code>
                    </td>
                    <td>{clusterName(peer.clusterId)}</td>
                    <td>
                      <Labels labels={peer.labels} />
                    </td>
                    <td>
                      <StateBadge state={peer.state} />
                    </td>
                    <td title={dateTime(peer.lastKeepalive)}>{secondsAgo(peer.silentForSeconds)}</td>
                    <td>
                      {peer.tasks.complete} complete
                      {peer.tasks.count > peer.tasks.complete && `, ${peer.tasks.count - peer.tasks.complete} partial`}
                    </td>
                    <td>
                      {bytes(peer.tasks.bytesFromPeers)} / {bytes(peer.tasks.bytesFromSeeds)} / {bytes(peer.tasks.bytesFromOrigin)}
                    </td>
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
