import { NavLink, Outlet } from 'react-router';
import { useSession } from '../session';

const PAGES = [
  { to: '/', label: 'Overview' },
  { to: '/clusters', label: 'Clusters' },
  { to: '/schedulers', label: 'Schedulers' },
  { to: '/peers', label: 'Peers' },
  { to: '/tasks', label: 'Tasks' },
  { to: '/jobs', label: 'Jobs' },
  { to: '/audit', label: 'Audit log' },
];

export function Layout() {
  const { me, logout } = useSession();
  return (
    <>
      <header className="topbar">
        <span className="brand">Starling</span>
        <nav aria-label="Pages">
          {PAGES.map((page) => (
            <NavLink key={page.to} to={page.to} end={page.to === '/'}>
              {page.label}
            </NavLink>
          ))}
        </nav>
        <span className="who">
          {me.user.name} <span className="badge">{me.user.role}</span>
          <button type="button" className="link" onClick={() => logout()}>
            Log out
          </button>
        </span>
      </header>
      <main>
        <Outlet />
      </main>
    </>
  );
}
