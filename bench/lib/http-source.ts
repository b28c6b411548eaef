// A tiny traffic source for measuring the cluster's caps: `GET /<bytes>` answers that many
// zero bytes (streamed from one 1 MiB buffer, respecting back-pressure). Runs as a plain
// `node -e` program inside a host's namespace; curl in another host is the client.

import type { Cluster, ClusterHost } from './cluster.js';
import type { Service } from '../../test/fixtures/processes.js';

const SOURCE_JS = `
const http = require('node:http');
const buf = Buffer.alloc(1 << 20);
const [host, port] = [process.argv[1], Number(process.argv[2])];
http.createServer((req, res) => {
  const total = Number(req.url.slice(1)) || 0;
  res.writeHead(200, { 'content-length': String(total), 'content-type': 'application/octet-stream' });
  let left = total;
  const pump = () => {
    while (left > 0) {
      const n = Math.min(left, buf.length);
      left -= n;
      if (!res.write(n === buf.length ? buf : buf.subarray(0, n))) return res.once('drain', pump);
    }
    res.end();
  };
  pump();
}).listen(port, host, () => console.log('listening ' + host + ':' + port));
`;

export async function startHttpSource(cluster: Cluster, host: ClusterHost, port = 8080): Promise<{ url: string; service: Service }> {
  const service = await cluster.spawn(host, process.execPath, ['-e', SOURCE_JS, host.ip, String(port)], { name: `${host.name}-source` });
  const url = `http://${host.ip}:${port}`;
  for (let i = 0; ; i++) {
    if (!service.running) throw new Error(`http source on ${host.name} exited: ${service.logTail()}`);
    if (service.readLog().includes('listening')) break;
    if (i > 200) throw new Error(`http source on ${host.name} did not start`);
    await new Promise((r) => setTimeout(r, 25));
  }
  return { url, service };
}

export interface CurlResult {
  status: number;
  bytes: number;
  seconds: number;
  ttfb: number;
}

/** GET `url` from inside `host` with curl, body discarded. */
export async function curlFrom(cluster: Cluster, host: ClusterHost, url: string, timeoutMs = 600_000): Promise<CurlResult> {
  const res = await cluster.exec(
    host,
    'curl',
    ['-s', '-o', '/dev/null', '--noproxy', '*', '-w', '%{http_code} %{size_download} %{time_total} %{time_starttransfer}', url],
    { timeoutMs },
  );
  const [status, bytes, seconds, ttfb] = res.stdout.trim().split(' ').map(Number) as [number, number, number, number];
  if (status !== 200) throw new Error(`GET ${url} from ${host.name}: HTTP ${status}`);
  return { status, bytes, seconds, ttfb };
}
