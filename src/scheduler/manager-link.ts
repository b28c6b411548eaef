import { hostname } from 'node:os';
import { Agent, request } from 'undici';
import { clientTlsOptions, type ClientTls } from '../common/tls.js';
import type { Logger } from '../common/log.js';
import { SCHEDULER_KEEPALIVE_PATH, type SchedulerKeepalive } from '../rpc/manager-api.js';
import { schedulingSchema, type SchedulingConfig } from './config.js';
import type { ClusterToken } from '../common/token.js';

const KEEPALIVE_MS = 5_000;

/**
 * Keeps the scheduler registered with the manager and applies the scheduler cluster's
 * settings (parent limits, back-to-source limit, topology rules) as the manager changes them,
 * without a restart.
 */
export class ManagerLink {
  private timer?: NodeJS.Timeout;
  private version?: string | number;
  private stopped = false;

  constructor(
    private readonly managerUrl: URL,
    private readonly self: { ip: string; port: number; clusterName?: string },
    private readonly clusterToken: ClusterToken,
    tls: ClientTls | undefined,
    private readonly apply: (config: SchedulingConfig) => void,
    private readonly log: Logger,
  ) {
    if (tls) this.dispatcher = new Agent({ connect: clientTlsOptions(tls) });
  }

  private readonly dispatcher?: Agent;

  async start(): Promise<void> {
    const round = async () => {
      try {
        await this.keepalive();
      } catch (error) {
        this.log.warn({ manager: this.managerUrl.origin, err: (error as Error).message }, 'manager keep-alive failed');
      }
      if (!this.stopped) {
        this.timer = setTimeout(() => void round(), KEEPALIVE_MS);
        this.timer.unref();
      }
    };
    await round();
  }

  private async keepalive(): Promise<void> {
    const keepalive: SchedulerKeepalive = {
      hostname: hostname(),
      ip: this.self.ip,
      port: this.self.port,
      ...(this.self.clusterName ? { clusterName: this.self.clusterName } : {}),
    };
    const response = await request(new URL(SCHEDULER_KEEPALIVE_PATH, this.managerUrl), {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: this.clusterToken.authorization },
      body: JSON.stringify(keepalive),
      headersTimeout: 5_000,
      bodyTimeout: 5_000,
      ...(this.dispatcher ? { dispatcher: this.dispatcher } : {}),
    });
    const text = await response.body.text();
    if (response.statusCode !== 200) throw new Error(`manager answered ${response.statusCode}: ${text.slice(0, 200)}`);
    const body = JSON.parse(text) as { config?: unknown; configVersion?: string | number };
    if (body.configVersion === undefined || body.configVersion === this.version) return;
    const parsed = schedulingSchema.safeParse(body.config ?? {});
    if (!parsed.success) {
      this.log.error({ err: parsed.error.message }, 'manager sent scheduling settings this scheduler cannot use; keeping the current ones');
      return;
    }
    this.version = body.configVersion;
    this.apply(parsed.data);
    this.log.info({ version: body.configVersion, config: parsed.data }, 'scheduling settings from the manager applied');
  }

  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    void this.dispatcher?.close();
  }
}
