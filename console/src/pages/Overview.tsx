import { useQuery } from '@tanstack/react-query';
import type { ReactNode } from 'react';
import { Link } from 'react-router';
import { api, type Overview as OverviewData } from '../api';
import { Async } from '../components/Async';
import { SourcesBar } from '../components/Bars';
import { bytes, percent } from '../format';

/** The first question: is P2P working? Then what the cluster is made of. */
export function Overview() {
  const overview = useQuery({ queryKey: ['overview'], queryFn: api.overview, refetchInterval: 5000 });
  return (
    <>
      <h1>Overview</h1>
      <Async query={overview}>
        {(data) => (
          <>
            <P2PVerdict data={data} />
            <section className="cards">
              <Card title="Clusters" to="/clusters">
                {data.clusters}
              </Card>
              <Card title="Schedulers" to="/schedulers">
                {data.schedulers.active} active{data.schedulers.inactive > 0 && `, ${data.schedulers.inactive} inactive`}
              </Card>
              <Card title="Peers" to="/peers">
                {data.peers.active} active ({data.peers.seeds} {data.peers.seeds === 1 ? 'seed' : 'seeds'})
                {data.peers.inactive > 0 && `, ${data.peers.inactive} inactive`}
              </Card>
              <Card title="Tasks" to="/tasks">
                {data.tasks}
              </Card>
              <Card title="Jobs" to="/jobs">
                {data.jobs.running + data.jobs.pending} running, {data.jobs.succeeded} succeeded, {data.jobs.failed} failed
              </Card>
            </section>
          </>
        )}
      </Async>
    </>
  );
}

function P2PVerdict({ data }: { data: OverviewData }) {
  const { fromPeers, fromSeeds, fromOrigin, p2pRatio } = data.bytes;
  const total = fromPeers + fromSeeds + fromOrigin;
  let verdict: string;
  if (p2pRatio === null) verdict = 'No transfers reported yet.';
  else if (p2pRatio >= 0.5) verdict = 'Yes: most bytes came from peers and seeds.';
  else if (p2pRatio > 0) verdict = 'Partly: most bytes still came from the origin.';
  else verdict = 'Not yet: every byte so far came from the origin (including what seeds preheated).';
  return (
    <section className="panel" aria-labelledby="p2p-title">
      <h2 id="p2p-title">Is P2P working?</h2>
      <p className="verdict">{verdict}</p>
      <dl className="figures">
        <div>
          <dt>P2P hit ratio</dt>
          <dd data-testid="p2p-ratio">{p2pRatio === null ? '–' : percent(p2pRatio)}</dd>
        </div>
        <div>
          <dt>Bytes held by peers</dt>
          <dd>{bytes(total)}</dd>
        </div>
      </dl>
      <SourcesBar sources={{ peers: fromPeers, seeds: fromSeeds, origin: fromOrigin }} />
      <p className="muted">Summed from what every peer reports about the blobs it holds now.</p>
    </section>
  );
}

function Card({ title, to, children }: { title: string; to: string; children: ReactNode }) {
  return (
    <Link to={to} className="card">
      <span className="card-title">{title}</span>
      <span className="card-value">{children}</span>
    </Link>
  );
}
