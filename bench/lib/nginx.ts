// A private nginx (Debian's nginx-light) serving one directory as static files: the baseline
// for "how fast can this machine hand a cached file to a client over loopback".
// Own prefix, config, pid and temp paths in a temp dir; `daemon off;` so that the process
// we spawn is the master and stop() reaches it (and its workers, same process group).

import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { freePort, makeTempDir, spawnService, waitForHttp, type Service } from '../../test/fixtures/processes.js';

export interface Nginx {
  /** Server with sendfile on (zero-copy from the page cache: the baseline). */
  url: string;
  /** Same files with sendfile off: read() into 1 MiB buffers and write(), like a userspace server. */
  copyUrl: string;
  service: Service;
  /** pids of the worker processes (children of the master). */
  workerPids(): number[];
  stop(): Promise<void>;
}

export interface NginxOptions {
  /** Directory served at `/`. */
  root: string;
  /** Worker processes; 1 = the same single event loop as the peer. */
  workers?: number;
  binary?: string;
}

export async function startNginx(opts: NginxOptions): Promise<Nginx> {
  const tmp = await makeTempDir('starling-bench-nginx-');
  const port = await freePort();
  const copyPort = await freePort();
  const t = (name: string) => path.join(tmp.path, name);
  for (const dir of ['body', 'proxy', 'fastcgi', 'uwsgi', 'scgi', 'logs']) await fsp.mkdir(t(dir));
  // As root, workers would run as nobody and could not enter our 0700 temp dirs.
  const user = process.getuid?.() === 0 ? 'user root root;' : '';
  const conf = `
${user}
daemon off;
worker_processes ${opts.workers ?? 1};
pid ${t('nginx.pid')};
error_log ${t('logs/error.log')} warn;
events { worker_connections 1024; }
http {
  access_log off;
  default_type application/octet-stream;
  sendfile on;
  tcp_nopush on;
  keepalive_timeout 65;
  client_body_temp_path ${t('body')};
  proxy_temp_path ${t('proxy')};
  fastcgi_temp_path ${t('fastcgi')};
  uwsgi_temp_path ${t('uwsgi')};
  scgi_temp_path ${t('scgi')};
  server {
    listen 127.0.0.1:${port};
    root ${opts.root};
    location / { }
  }
  server {
    listen 127.0.0.1:${copyPort};
    root ${opts.root};
    sendfile off;
    output_buffers 2 1m;
    location / { }
  }
}
`;
  await fsp.writeFile(t('nginx.conf'), conf);
  const service = await spawnService({
    cmd: opts.binary ?? '/usr/sbin/nginx',
    args: ['-p', tmp.path, '-c', t('nginx.conf'), '-e', t('logs/error.log')],
    name: 'nginx',
    logFile: t('logs/stdout.log'),
  });
  const url = `http://127.0.0.1:${port}`;
  try {
    await waitForHttp(`${url}/`, 10_000, service);
  } catch (err) {
    await service.stop();
    await tmp.remove();
    throw err;
  }
  return {
    url,
    copyUrl: `http://127.0.0.1:${copyPort}`,
    service,
    workerPids: () => childPids(service.pid),
    async stop() {
      await service.stop();
      await tmp.remove();
    },
  };
}

export function childPids(pid: number): number[] {
  const out: number[] = [];
  let tasks: string[] = [];
  try {
    tasks = fs.readdirSync(`/proc/${pid}/task`);
  } catch {
    return out;
  }
  for (const tid of tasks) {
    try {
      const text = fs.readFileSync(`/proc/${pid}/task/${tid}/children`, 'utf8').trim();
      if (text) out.push(...text.split(/\s+/).map(Number));
    } catch {
      // thread gone
    }
  }
  return out;
}
