import { useQuery, useQueryClient } from '@tanstack/react-query';
import { createContext, useCallback, useContext, useEffect, useMemo, useState, type ReactNode } from 'react';
import { api, ApiError, tokenStore, type Me } from './api';

/** Who is logged in, and the means to log out. */
export interface Session {
  me: Me;
  isAdmin: boolean;
  logout: (notice?: string) => void;
}

const SessionContext = createContext<Session | null>(null);

export function useSession(): Session {
  const session = useContext(SessionContext);
  if (!session) throw new Error('useSession used outside a logged-in page');
  return session;
}

/** Fired when any API call answers 401: the token was revoked or expired while in use. */
export const UNAUTHORIZED_EVENT = 'starling:unauthorized';

export interface LoginProps {
  /** Why the user is (back) on the login page. */
  notice?: string;
  onLogin: (token: string, me: Me) => void;
}

/**
 * Shows the login page until a token is known good (GET /me answers), then the children with
 * the session. A token the manager stops accepting sends the user back to the login page.
 */
export function SessionGate({ Login, children }: { Login: (props: LoginProps) => ReactNode; children: ReactNode }) {
  const client = useQueryClient();
  const [token, setToken] = useState<string | null>(tokenStore.get());
  const [notice, setNotice] = useState<string>();

  const logout = useCallback(
    (why?: string) => {
      tokenStore.clear();
      client.clear();
      setToken(null);
      setNotice(why);
    },
    [client],
  );

  useEffect(() => {
    const onUnauthorized = () => logout('Your token is no longer accepted; log in again.');
    window.addEventListener(UNAUTHORIZED_EVENT, onUnauthorized);
    return () => window.removeEventListener(UNAUTHORIZED_EVENT, onUnauthorized);
  }, [logout]);

  const me = useQuery({
    queryKey: ['me'],
    queryFn: () => api.me(token ?? undefined),
    enabled: Boolean(token),
    retry: false,
    staleTime: Infinity,
  });

  const session = useMemo<Session | null>(
    () => (me.data ? { me: me.data, isAdmin: me.data.user.role === 'admin', logout } : null),
    [me.data, logout],
  );

  const onLogin = (good: string, who: Me) => {
    tokenStore.set(good);
    client.setQueryData(['me'], who);
    setNotice(undefined);
    setToken(good);
  };

  if (!token) return <Login notice={notice} onLogin={onLogin} />;
  if (me.error) {
    const why =
      me.error instanceof ApiError && me.error.status === 401 ? 'Your token is no longer accepted; log in again.' : me.error.message;
    return <Login notice={why} onLogin={onLogin} />;
  }
  if (!session) return <p className="loading">Loading…</p>;
  return <SessionContext.Provider value={session}>{children}</SessionContext.Provider>;
}
