import { request } from 'undici';
import type { Host, Task } from './resources.js';

/** What a seed needs to fetch a task on the scheduler's behalf. */
export interface SeedTriggerBody {
  taskId: string;
  contentLength: number;
  pieceSize: number;
  origin: { url: string; headers: Record<string, string> };
}

/** The seed's upload server path that starts a fetch of a task from its origin. */
export const SEED_TRIGGER_PATH = '/_starling/seed';

/** Asks a seed peer, over its upload server, to fetch a task. */
export async function triggerSeedOverHttp(seed: Host, task: Task, clusterToken: string | undefined): Promise<void> {
  if (!task.origin) throw new Error(`task ${task.id} has no origin to fetch from`);
  const body: SeedTriggerBody = {
    taskId: task.id,
    contentLength: task.contentLength,
    pieceSize: task.pieceSize,
    origin: { url: task.origin.url, headers: task.origin.headers ?? {} },
  };
  const host = seed.info.ip.includes(':') ? `[${seed.info.ip}]` : seed.info.ip;
  const response = await request(`http://${host}:${seed.info.uploadPort}${SEED_TRIGGER_PATH}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(clusterToken ? { authorization: `Bearer ${clusterToken}` } : {}) },
    body: JSON.stringify(body),
    headersTimeout: 10_000,
    bodyTimeout: 10_000,
  });
  const text = await response.body.text();
  if (response.statusCode !== 202) throw new Error(`seed ${seed.id} answered ${response.statusCode}: ${text.slice(0, 200)}`);
}
