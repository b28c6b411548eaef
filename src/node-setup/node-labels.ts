// `starling node-labels`: the peer's init container asks the Kubernetes API for its own node's
// labels (the downward API cannot give a pod its node's labels) and writes them where the peer's
// --labels-file reads them; the peer turns topology.kubernetes.io/zone into `zone`, and the
// cluster's rack label (there is no standard one) becomes `rack` here.

import { readFile, rename, writeFile } from 'node:fs/promises';
import { Agent, request } from 'undici';
import { stringify } from 'yaml';
import { NodeSetupError } from './errors.js';

const SERVICE_ACCOUNT = '/var/run/secrets/kubernetes.io/serviceaccount';

export interface NodeLabelsOptions {
  node: string;
  /** The API server's base URL; default https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT. */
  apiServer?: string;
  tokenFile?: string;
  caFile?: string;
  /** The node label that names the node's rack (e.g. topology.example.com/rack); copied to `rack`. */
  rackLabel?: string;
}

export async function fetchNodeLabels(options: NodeLabelsOptions): Promise<Record<string, string>> {
  const base = options.apiServer ?? inClusterApiServer();
  const token = (await readRequired(options.tokenFile ?? `${SERVICE_ACCOUNT}/token`, 'service account token')).trim();
  const url = new URL(`/api/v1/nodes/${encodeURIComponent(options.node)}`, base);
  const ca = url.protocol === 'https:' ? await readRequired(options.caFile ?? `${SERVICE_ACCOUNT}/ca.crt`, 'cluster CA') : undefined;
  const dispatcher = new Agent({ connect: ca ? { ca } : {} });
  try {
    let response;
    try {
      response = await request(url, {
        headers: { authorization: `Bearer ${token}`, accept: 'application/json' },
        dispatcher,
        headersTimeout: 15_000,
        bodyTimeout: 15_000,
      });
    } catch (error) {
      throw new NodeSetupError(`cannot reach the Kubernetes API at ${base}: ${(error as Error).message}`);
    }
    const text = await response.body.text();
    if (response.statusCode !== 200) {
      const hint =
        response.statusCode === 403
          ? ' (the service account needs "get" on nodes)'
          : response.statusCode === 404
            ? ` (no node named "${options.node}")`
            : '';
      throw new NodeSetupError(`GET ${url.pathname}: HTTP ${response.statusCode} ${text.slice(0, 200).trim()}${hint}`);
    }
    const labels = (JSON.parse(text) as { metadata?: { labels?: Record<string, string> } }).metadata?.labels ?? {};
    const out: Record<string, string> = { ...labels };
    if (options.rackLabel) {
      const rack = labels[options.rackLabel];
      if (rack !== undefined) out.rack = rack;
    }
    return out;
  } finally {
    await dispatcher.close();
  }
}

/** Writes the labels as a YAML map (what `starling peer --labels-file` reads), atomically. */
export async function writeNodeLabels(file: string, labels: Record<string, string>): Promise<void> {
  const temp = `${file}.tmp-${process.pid}`;
  await writeFile(temp, stringify(labels));
  await rename(temp, file);
}

function inClusterApiServer(): string {
  const host = process.env.KUBERNETES_SERVICE_HOST;
  const port = process.env.KUBERNETES_SERVICE_PORT;
  if (!host || !port) throw new NodeSetupError('not in a Kubernetes pod (KUBERNETES_SERVICE_HOST is not set): pass --api-server');
  return `https://${host.includes(':') ? `[${host}]` : host}:${port}`;
}

async function readRequired(path: string, what: string): Promise<string> {
  try {
    return await readFile(path, 'utf8');
  } catch (error) {
    throw new NodeSetupError(`cannot read the ${what} at ${path}: ${(error as Error).message}`);
  }
}
