import { useState, type FormEvent } from 'react';
import { api } from '../api';
import { ErrorMessage } from '../components/ErrorMessage';
import type { LoginProps } from '../session';

/** Log in by pasting a personal access token; it is checked with GET /me before it is kept. */
export function Login({ notice, onLogin }: LoginProps) {
  const [token, setToken] = useState('');
  const [checking, setChecking] = useState(false);
  const [error, setError] = useState<unknown>();

  const submit = async (event: FormEvent) => {
    event.preventDefault();
    const candidate = token.trim();
    if (!candidate) return;
    setChecking(true);
    setError(undefined);
    try {
      onLogin(candidate, await api.me(candidate));
    } catch (refused) {
      setError(refused);
      setChecking(false);
    }
  };

  return (
    <main className="login">
      <h1>Starling console</h1>
      {notice && !error && <p className="notice">{notice}</p>}
      <form onSubmit={(event) => void submit(event)}>
        <label htmlFor="token">Personal access token</label>
        <input
          id="token"
          type="password"
          autoComplete="off"
          autoFocus
          value={token}
          onChange={(event) => setToken(event.target.value)}
          placeholder="paste a token"
        />
        <button type="submit" disabled={!token.trim() || checking}>
          {checking ? 'Checking…' : 'Log in'}
        </button>
        <ErrorMessage error={error} />
      </form>
      <p className="muted">
        An admin's token is the one in the manager's <code>--admin-token-file</code>, or the one it printed at its first start. The token is
        kept in this tab only.
      </p>
    </main>
  );
}
