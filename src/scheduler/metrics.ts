import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import type { Resources } from './resources.js';

export function createSchedulerMetrics(registry: Registry, resources: Resources) {
  const registers = [registry];
  return {
    hosts: new Gauge({
      name: 'starling_scheduler_hosts',
      help: 'Hosts alive, by type',
      labelNames: ['type'] as const,
      registers,
      collect() {
        let seeds = 0;
        for (const host of resources.hosts.values()) if (host.isSeed) seeds++;
        this.set({ type: 'seed' }, seeds);
        this.set({ type: 'normal' }, resources.hosts.size - seeds);
      },
    }),
    tasks: new Gauge({
      name: 'starling_scheduler_tasks',
      help: 'Tasks with at least one peer',
      registers,
      collect() {
        this.set(resources.tasks.size);
      },
    }),
    peers: new Gauge({
      name: 'starling_scheduler_peers',
      help: 'Peers (host × task) with an open stream',
      registers,
      collect() {
        let count = 0;
        for (const task of resources.tasks.values()) count += task.peers.size;
        this.set(count);
      },
    }),
    schedulingSeconds: new Histogram({
      name: 'starling_scheduler_scheduling_duration_seconds',
      help: 'Time to decide what a peer does next',
      labelNames: ['outcome'] as const,
      buckets: [0.0001, 0.0005, 0.001, 0.005, 0.02, 0.1],
      registers,
    }),
    bytes: new Counter({
      name: 'starling_scheduler_bytes_total',
      help: 'Bytes that peers reported storing, by where they came from (peer, seed, origin)',
      labelNames: ['source'] as const,
      registers,
    }),
    seedTriggers: new Counter({
      name: 'starling_scheduler_seed_triggers_total',
      help: 'Seed peers asked to fetch a task, by result',
      labelNames: ['result'] as const,
      registers,
    }),
    pieceFailures: new Counter({
      name: 'starling_scheduler_piece_failures_total',
      help: 'Piece failures reported by peers, by reason',
      labelNames: ['reason'] as const,
      registers,
    }),
  };
}

export type SchedulerMetrics = ReturnType<typeof createSchedulerMetrics>;
