import { Agent, request } from 'undici';
import type { ClusterToken } from '../common/token.js';
import { clientTlsOptions, httpScheme, type ClientTls } from '../common/tls.js';
import { SEED_TRIGGER_PATH, type BlobFetchRequest } from '../rpc/upload-api.js';
import type { Host, Task } from './resources.js';

/** Asks seed peers, over their upload servers (HTTPS when the cluster uses TLS), to fetch tasks. */
export class SeedTrigger {
  private readonly dispatcher?: Agent;

  constructor(
    private readonly clusterToken: ClusterToken,
    private readonly tls: ClientTls | undefined,
  ) {
    if (tls) this.dispatcher = new Agent({ connect: clientTlsOptions(tls) });
  }

  async trigger(seed: Host, task: Task): Promise<void> {
    if (!task.origin?.public) throw new Error(`task ${task.id} has no public origin a seed could fetch it from`);
    const body: BlobFetchRequest = {
      taskId: task.id,
      contentLength: task.contentLength,
      pieceSize: task.pieceSize,
      origin: { url: task.origin.url, headers: {} },
    };
    const host = seed.info.ip.includes(':') ? `[${seed.info.ip}]` : seed.info.ip;
    const response = await request(`${httpScheme(this.tls)}://${host}:${seed.info.uploadPort}${SEED_TRIGGER_PATH}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: this.clusterToken.authorization },
      body: JSON.stringify(body),
      headersTimeout: 10_000,
      bodyTimeout: 10_000,
      ...(this.dispatcher ? { dispatcher: this.dispatcher } : {}),
    });
    const text = await response.body.text();
    if (response.statusCode !== 202) throw new Error(`seed ${seed.id} answered ${response.statusCode}: ${text.slice(0, 200)}`);
  }

  async close(): Promise<void> {
    await this.dispatcher?.close();
  }
}
