import { hostname } from 'node:os';
import { Agent, request } from 'undici';
import type { Logger } from '../../common/log.js';
import { clientTlsOptions, type ClientTls } from '../../common/tls.js';
import { PEER_KEEPALIVE_PATH, type PeerKeepalive, type PeerTaskReport } from '../../rpc/manager-api.js';
import type { HostInfo } from '../../rpc/scheduler-api.js';
import type { ClusterToken } from '../../common/token.js';

const KEEPALIVE_MS = 5_000;

/**
 * Keeps the peer registered with the manager and learns from it which schedulers serve this
 * peer's cluster (matched by zone, CIDR and hostname); the scheduler list follows the manager.
 */
export class ManagerClient {
  private timer?: NodeJS.Timeout;
  private stopped = false;

  private readonly dispatcher?: Agent;

  constructor(
    private readonly managerUrl: URL,
    private readonly clusterToken: ClusterToken,
    tls: ClientTls | undefined,
    private readonly log: Logger,
  ) {
    if (tls) this.dispatcher = new Agent({ connect: clientTlsOptions(tls) });
  }

  /** Registers now (resolving with the first scheduler list), then every few seconds. */
  async start(report: () => PeerKeepalive, onSchedulers: (addresses: string[]) => void): Promise<void> {
    const round = async () => {
      try {
        onSchedulers(await this.keepalive(report()));
      } catch (error) {
        this.log.warn(
          { manager: this.managerUrl.origin, err: (error as Error).message },
          'manager keep-alive failed; keeping the schedulers known so far',
        );
      }
      if (!this.stopped) {
        this.timer = setTimeout(() => void round(), KEEPALIVE_MS);
        this.timer.unref();
      }
    };
    await round();
  }

  private async keepalive(body: PeerKeepalive): Promise<string[]> {
    const response = await request(new URL(PEER_KEEPALIVE_PATH, this.managerUrl), {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: this.clusterToken.authorization },
      body: JSON.stringify(body),
      headersTimeout: 5_000,
      bodyTimeout: 5_000,
      ...(this.dispatcher ? { dispatcher: this.dispatcher } : {}),
    });
    const text = await response.body.text();
    if (response.statusCode !== 200) throw new Error(`manager answered ${response.statusCode}: ${text.slice(0, 200)}`);
    const parsed = JSON.parse(text) as { schedulers?: unknown };
    if (!Array.isArray(parsed.schedulers) || !parsed.schedulers.every((s) => typeof s === 'string')) {
      throw new Error('manager keep-alive answer has no scheduler list');
    }
    return parsed.schedulers;
  }

  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    void this.dispatcher?.close();
  }
}

export function keepaliveFromHost(host: HostInfo, mirrorUrl: string, tasks: PeerTaskReport[]): PeerKeepalive {
  return {
    hostId: host.id,
    hostname: hostname(),
    ip: host.ip,
    uploadPort: host.uploadPort,
    mirrorUrl,
    labels: host.labels,
    seed: host.seed,
    tasks,
  };
}
