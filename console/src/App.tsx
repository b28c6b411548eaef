import { BrowserRouter, Route, Routes } from 'react-router';
import { Layout } from './components/Layout';
import { Audit } from './pages/Audit';
import { Clusters } from './pages/Clusters';
import { JobDetail } from './pages/JobDetail';
import { Jobs } from './pages/Jobs';
import { Login } from './pages/Login';
import { Overview } from './pages/Overview';
import { Peers } from './pages/Peers';
import { Schedulers } from './pages/Schedulers';
import { Tasks } from './pages/Tasks';
import { SessionGate } from './session';

export function App() {
  return (
    <SessionGate Login={Login}>
      <BrowserRouter>
        <Routes>
          <Route element={<Layout />}>
            <Route index element={<Overview />} />
            <Route path="clusters" element={<Clusters />} />
            <Route path="schedulers" element={<Schedulers />} />
            <Route path="peers" element={<Peers />} />
            <Route path="tasks" element={<Tasks />} />
            <Route path="jobs" element={<Jobs />} />
            <Route path="jobs/:id" element={<JobDetail />} />
            <Route path="audit" element={<Audit />} />
            <Route path="*" element={<NotFound />} />
          </Route>
        </Routes>
      </BrowserRouter>
    </SessionGate>
  );
}

function NotFound() {
  return (
    <>
      <h1>No such page</h1>
      <p className="muted">Pick a page above.</p>
    </>
  );
}
