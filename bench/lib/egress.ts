// A host's egress over time during a cluster benchmark (the registry's, or a seeder's): its NIC's
// counters read every 250 ms, as TCP payload. For the report's peak rate and its egress plots.
import { nowSeconds, tcpPayloadBytes, type Cluster, type ClusterHost } from './cluster.js';
import { itemAt } from '../../src/common/indexing.js';

export interface EgressRecord {
  /** [seconds since the sampler started, payload bytes sent since then]. */
  samples: Array<[number, number]>;
  /** Payload bytes sent between start and stop. */
  bytes: number;
  /** The highest rate over any window of at least 0.5 s, in bit/s. */
  peakBitsPerSecond: number;
}

export interface EgressSampler {
  stop(): Promise<EgressRecord>;
}

/** Starts sampling now; start it right before the benchmark's clock. */
export async function startEgressSampler(c: Cluster, host: ClusterHost, intervalMs = 250): Promise<EgressSampler> {
  const base = await c.counters(host);
  const t0 = nowSeconds();
  const read = async (): Promise<[number, number]> => {
    const now = await c.counters(host);
    return [+(nowSeconds() - t0).toFixed(3), tcpPayloadBytes(now.txBytes - base.txBytes, now.txPackets - base.txPackets)];
  };
  const samples: Array<[number, number]> = [[0, 0]];
  let running = true;
  const loop = (async () => {
    while (running) {
      await new Promise((resolve) => setTimeout(resolve, intervalMs));
      if (running) samples.push(await read());
    }
  })();
  return {
    async stop() {
      running = false;
      await loop;
      samples.push(await read());
      return { samples, bytes: itemAt(samples, samples.length - 1)[1], peakBitsPerSecond: peakRate(samples) };
    },
  };
}

/** Rates over windows of at least 0.5 s, so that one late sample does not make a spike. */
function peakRate(samples: Array<[number, number]>): number {
  let peak = 0;
  for (let i = 1; i < samples.length; i++) {
    let j = i - 1;
    const [t1, b1] = itemAt(samples, i);
    while (j > 0 && t1 - itemAt(samples, j)[0] < 0.5) j--;
    const [tj, bj] = itemAt(samples, j);
    if (t1 > tj) peak = Math.max(peak, ((b1 - bj) * 8) / (t1 - tj));
  }
  return peak;
}

/** Rate steps (seconds, Mbit/s) between consecutive samples, for a step plot. */
export function egressRateSteps(samples: Array<[number, number]>): Array<[number, number]> {
  const points: Array<[number, number]> = [];
  for (let i = 1; i < samples.length; i++) {
    const [t0, b0] = itemAt(samples, i - 1);
    const [t1, b1] = itemAt(samples, i);
    if (t1 > t0) points.push([t0, ((b1 - b0) * 8) / (t1 - t0) / 1e6]);
  }
  return points;
}
