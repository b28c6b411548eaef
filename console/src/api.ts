// The one client of the manager's REST API (/api/v1): the shapes the console reads, and a
// request function that sends the personal access token and turns error answers into ApiError
// with the manager's own message.

export type State = 'active' | 'inactive';
export type JobState = 'pending' | 'running' | 'succeeded' | 'failed';
export type Role = 'admin' | 'read-only';

export interface User {
  id: number;
  name: string;
  role: Role;
  createdAt: string;
}

export interface Me {
  user: User;
  tokenId: number;
}

export interface TopologyRule {
  key: string;
  weight: number;
  strict: boolean;
}

export interface ClusterConfig {
  /** adaptive (the default): chains placed by measured link rates; mesh: several parents per peer; pipeline: fixed chains (see the README). */
  shape: 'adaptive' | 'mesh' | 'pipeline';
  pipeline: { fanout: number; seedFanout: number };
  candidateParentLimit: number;
  backToSourceLimit: number;
  retryLimit: number;
  topology: TopologyRule[];
  weights: { freeUpload: number; pieces: number; seed: number; failure: number };
  slowFactor: number;
}

export interface Cluster {
  id: number;
  name: string;
  config: ClusterConfig;
  configVersion: number;
  scopes: { zones: string[]; cidrs: string[]; hostnames: string[] };
  isDefault: boolean;
  createdAt: string;
  updatedAt: string;
}

export interface Scheduler {
  id: number;
  clusterId: number;
  hostname: string;
  ip: string;
  port: number;
  address: string;
  state: State;
  lastKeepalive: string;
  createdAt: string;
}

export interface Peer {
  id: number;
  clusterId: number;
  hostId: string;
  hostname: string;
  ip: string;
  uploadPort: number;
  mirrorUrl: string;
  labels: Record<string, string>;
  type: 'normal' | 'seed';
  state: State;
  lastKeepalive: string;
  silentForSeconds: number;
  tasks: { count: number; complete: number; bytesFromPeers: number; bytesFromSeeds: number; bytesFromOrigin: number };
  createdAt: string;
}

export interface Task {
  digest: string;
  size: number;
  peers: Array<{ hostId: string; complete: boolean }>;
  bytesFromPeers: number;
  bytesFromSeeds: number;
  bytesFromOrigin: number;
}

export interface LayerProgress {
  digest: string;
  size: number;
  peers: number;
  succeeded: number;
  failed: number;
  bytes: number;
}

export interface JobFetch {
  digest: string;
  hostId: string;
  peerAddress: string;
  state: JobState;
  size: number;
  bytes: number;
  error: string | null;
  updatedAt: string;
}

export interface Job {
  id: number;
  type: string;
  state: JobState;
  args: { image?: string; platform?: string; scope?: string; [key: string]: unknown };
  result: Record<string, unknown> | null;
  error: string | null;
  createdBy: string;
  createdAt: string;
  updatedAt: string;
  /** The manager replica that runs the job (or ran it last). */
  owner: string | null;
  /** Times a replica took the job over from one that died or stopped. */
  takeovers: number;
  progress: { tasks: number; pending: number; running: number; succeeded: number; failed: number; bytes: number; totalBytes: number };
  layers: LayerProgress[];
  tasks?: JobFetch[];
}

export interface PreheatRequest {
  type: 'preheat';
  image: string;
  platform: string;
  scope: string;
  credentials?: { username: string; password: string };
  insecure?: boolean;
}

export interface AuditEntry {
  id: number;
  actor: string;
  action: string;
  target: string;
  detail: Record<string, unknown>;
  at: string;
}

export interface Overview {
  clusters: number;
  schedulers: { active: number; inactive: number };
  peers: { active: number; inactive: number; seeds: number };
  jobs: Record<JobState, number>;
  tasks: number;
  bytes: { fromPeers: number; fromSeeds: number; fromOrigin: number; p2pRatio: number | null };
}

/** An answer other than 2xx, with the manager's error code and message. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

const TOKEN_KEY = 'starling.token';

/** The token lives in sessionStorage: it is gone when the tab closes. */
export const tokenStore = {
  get: (): string | null => sessionStorage.getItem(TOKEN_KEY),
  set: (token: string) => sessionStorage.setItem(TOKEN_KEY, token),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

async function request<T>(method: 'GET' | 'POST' | 'PATCH' | 'DELETE', path: string, body?: unknown, token = tokenStore.get()): Promise<T> {
  const headers: Record<string, string> = { accept: 'application/json' };
  if (token) headers.authorization = `Bearer ${token}`;
  if (body !== undefined) headers['content-type'] = 'application/json';
  let response: Response;
  try {
    response = await fetch(`/api/v1${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (error) {
    throw new ApiError(0, 'unreachable', `the manager cannot be reached: ${(error as Error).message}`);
  }
  const text = await response.text();
  let parsed: unknown;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {
    parsed = undefined;
  }
  if (!response.ok) {
    const error = (parsed as { error?: { code?: string; message?: string } } | undefined)?.error;
    throw new ApiError(response.status, error?.code ?? 'http_error', error?.message ?? `HTTP ${response.status} ${response.statusText}`);
  }
  return parsed as T;
}

function query(params: Record<string, string | number | undefined>): string {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) if (value !== undefined && value !== '') search.set(key, String(value));
  const text = search.toString();
  return text ? `?${text}` : '';
}

export const api = {
  /** Checks a token before it is kept: who it belongs to. */
  me: (token?: string) => request<Me>('GET', '/me', undefined, token ?? tokenStore.get()),
  overview: () => request<Overview>('GET', '/overview'),
  clusters: () => request<Cluster[]>('GET', '/clusters'),
  updateClusterConfig: (id: number, patch: Partial<ClusterConfig>) => request<Cluster>('PATCH', `/clusters/${id}/config`, patch),
  schedulers: () => request<Scheduler[]>('GET', '/schedulers'),
  peers: (filter: { type?: string; state?: string } = {}) => request<Peer[]>('GET', `/peers${query(filter)}`),
  tasks: (limit = 1000) => request<Task[]>('GET', `/tasks${query({ limit })}`),
  jobs: (limit = 50) => request<Job[]>('GET', `/jobs${query({ limit })}`),
  job: (id: number) => request<Job>('GET', `/jobs/${id}`),
  createPreheat: (body: PreheatRequest) => request<Job>('POST', '/jobs', body),
  audit: (filter: { before?: number; action?: string; actor?: string; limit?: number }) =>
    request<AuditEntry[]>('GET', `/audit${query(filter)}`),
};
