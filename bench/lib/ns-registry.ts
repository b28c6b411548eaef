// The origin registry of an emulated cluster: Debian's docker-registry (distribution 2.8)
// running inside a cluster host's namespace, listening on all of that host's addresses
// (its cluster IP, reached by the other hosts through the host's capped NIC, and its own
// loopback, used to push content without spending the cap or the egress counters).

import fsp from 'node:fs/promises';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { stringify } from 'yaml';
import { makeTempDir, type Service } from '../../test/fixtures/processes.js';
import { parseAccessLog, type RegistryRequest } from '../../test/fixtures/registry.js';
import type { Cluster, ClusterHost } from './cluster.js';

export interface NsRegistry {
  host: ClusterHost;
  port: number;
  /** http://<cluster ip>:<port>, as the other hosts reach it. */
  url: string;
  /** http://127.0.0.1:<port>, valid inside the registry's own namespace only. */
  localUrl: string;
  storageDir: string;
  service: Service;
  requests(): RegistryRequest[];
  /** Push a local file as a blob of `repo` (monolithic upload over the namespace's loopback). */
  pushBlobFile(repo: string, file: string, digest: string): Promise<void>;
  stop(): Promise<void>;
}

export async function startNsRegistry(cluster: Cluster, host: ClusterHost, port = 5000): Promise<NsRegistry> {
  const tmp = await makeTempDir('starling-bench-registry-');
  const storageDir = path.join(tmp.path, 'storage');
  const config = {
    version: 0.1,
    log: { level: 'warn', formatter: 'json', accesslog: { disabled: false } },
    storage: { filesystem: { rootdirectory: storageDir }, delete: { enabled: true } },
    http: { addr: `0.0.0.0:${port}`, secret: randomBytes(16).toString('hex') },
  };
  const configFile = path.join(tmp.path, 'config.yml');
  await fsp.writeFile(configFile, stringify(config));
  const service = await cluster.spawn(host, 'docker-registry', ['serve', configFile], {
    name: `${host.name}-registry`,
    logFile: path.join(tmp.path, 'registry.log'),
  });
  const url = `http://${host.ip}:${port}`;
  const localUrl = `http://127.0.0.1:${port}`;
  const stop = async () => {
    await service.stop();
    await tmp.remove();
  };
  try {
    for (let i = 0; ; i++) {
      if (!service.running) throw new Error(`docker-registry exited early:\n${service.logTail()}`);
      const res = await cluster.exec(host, 'curl', ['-s', '-o', '/dev/null', '-w', '%{http_code}', '--noproxy', '*', `${localUrl}/v2/`], {
        allowFail: true,
      });
      if (res.stdout.trim() === '200') break;
      if (i > 300) throw new Error(`docker-registry did not answer on ${localUrl}:\n${service.logTail()}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  } catch (err) {
    await stop();
    throw err;
  }
  return {
    host,
    port,
    url,
    localUrl,
    storageDir,
    service,
    requests: () => parseAccessLog(service.readLog()),
    async pushBlobFile(repo, file, digest) {
      // POST starts an upload; its Location (absolute, built from our Host header) takes the PUT.
      const post = await cluster.exec(host, 'curl', [
        '-s',
        '-X',
        'POST',
        '--noproxy',
        '*',
        '-D',
        '-',
        '-o',
        '/dev/null',
        `${localUrl}/v2/${repo}/blobs/uploads/`,
      ]);
      const location = /^location:\s*(\S+)\s*$/im.exec(post.stdout)?.[1];
      if (!/^HTTP\/\S+ 202/.test(post.stdout) || !location) throw new Error(`blob upload start failed:\n${post.stdout}`);
      const put = new URL(location, localUrl);
      put.searchParams.set('digest', digest);
      const res = await cluster.exec(
        host,
        'curl',
        [
          '-s',
          '-X',
          'PUT',
          '--noproxy',
          '*',
          '-o',
          '/dev/null',
          '-w',
          '%{http_code}',
          '-H',
          'Content-Type: application/octet-stream',
          '--upload-file',
          file,
          put.toString(),
        ],
        { timeoutMs: 600_000 },
      );
      if (res.stdout.trim() !== '201') throw new Error(`blob PUT ${digest} answered HTTP ${res.stdout.trim()}`);
    },
    stop,
  };
}
