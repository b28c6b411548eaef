import * as grpc from '@grpc/grpc-js';
import { createHash } from 'node:crypto';
import type { Logger } from '../../common/log.js';
import type { ClientTls } from '../../common/tls.js';
import type { ClusterToken } from '../../common/token.js';
import { SchedulerClientClass, schedulerCredentials } from '../../rpc/proto.js';
import type { HostInfo, PeerPacket, SchedulerPacket, SchedulerServiceClient } from '../../rpc/scheduler-api.js';

/** A bidirectional AnnouncePeer stream as the peer sees it. */
export type PeerStream = grpc.ClientDuplexStream<PeerPacket, SchedulerPacket>;

interface SchedulerEndpoint {
  address: string;
  client: SchedulerServiceClient;
  healthy: boolean;
  /** The scheduler accepted this host's latest announcement (so it may open task streams). */
  announced: boolean;
}

/**
 * The peer's link to its schedulers: it announces the host to each (the announcement is also
 * the keep-alive) and opens one stream per task on the scheduler that owns the task by
 * rendezvous hashing, moving to the next one when that scheduler is unreachable.
 */
export class SchedulerClient {
  private endpoints: SchedulerEndpoint[] = [];
  private keepalive?: NodeJS.Timeout;
  private intervalMs = 5_000;
  private shutDown = false;
  /** Called once each, the next time a scheduler accepts an announcement after it had not. */
  private readonly reachableWaiters = new Set<() => void>();

  constructor(
    addresses: string[],
    private readonly clusterToken: ClusterToken,
    private readonly tls: ClientTls | undefined,
    private readonly log: Logger,
  ) {
    this.setAddresses(addresses);
  }

  get addresses(): string[] {
    return this.endpoints.map((endpoint) => endpoint.address);
  }

  /** Follows the scheduler list (from flags, or from the manager as schedulers come and go). */
  setAddresses(addresses: string[]): void {
    const wanted = new Set(addresses);
    for (const endpoint of this.endpoints) if (!wanted.has(endpoint.address)) endpoint.client.close();
    const kept = this.endpoints.filter((endpoint) => wanted.has(endpoint.address));
    const Service = SchedulerClientClass();
    for (const address of wanted) {
      if (kept.some((endpoint) => endpoint.address === address)) continue;
      const endpoint: SchedulerEndpoint = {
        address,
        client: new Service(address, schedulerCredentials(this.tls), {
          'grpc.keepalive_time_ms': 20_000,
          'grpc.max_receive_message_length': 16 * 1024 * 1024,
          'grpc.initial_reconnect_backoff_ms': 200,
          'grpc.max_reconnect_backoff_ms': 2_000,
        }),
        healthy: true,
        announced: false,
      };
      kept.push(endpoint);
      if (this.host) void this.announce(endpoint, this.host());
    }
    this.endpoints = kept;
  }

  private metadata(): grpc.Metadata {
    const metadata = new grpc.Metadata();
    metadata.set('authorization', this.clusterToken.authorization);
    return metadata;
  }

  /**
   * Announces the host now and then every keep-alive interval; `host()` gives its current
   * figures. While some scheduler has not accepted an announcement, retry every second.
   */
  startAnnouncing(host: () => HostInfo): Promise<void> {
    this.host = host;
    const round = async () => {
      await Promise.all(this.endpoints.map((endpoint) => this.announce(endpoint, host())));
      const pending = this.endpoints.some((endpoint) => !endpoint.announced);
      this.keepalive = setTimeout(() => void round(), pending ? Math.min(1_000, this.intervalMs) : this.intervalMs);
      this.keepalive.unref();
    };
    return round();
  }

  private host?: () => HostInfo;

  /** Makes sure the scheduler knows this host before a task stream is opened on it. */
  async ready(address: string): Promise<boolean> {
    const endpoint = this.endpoints.find((e) => e.address === address);
    if (!endpoint) return false;
    if (!endpoint.announced && this.host) await this.announce(endpoint, this.host());
    return endpoint.announced;
  }

  private announce(endpoint: SchedulerEndpoint, host: HostInfo): Promise<void> {
    return new Promise((resolve) => {
      endpoint.client.AnnounceHost(
        { host },
        this.metadata(),
        { deadline: Date.now() + 3_000 },
        (error: grpc.ServiceError | null, response?: { keepaliveIntervalMs: number }) => {
          if (error) {
            if (endpoint.healthy)
              this.log.warn({ scheduler: endpoint.address, err: error.details || error.message }, 'scheduler unreachable');
            endpoint.healthy = false;
            endpoint.announced = false;
          } else {
            const wasAnnounced = endpoint.announced;
            endpoint.announced = true;
            if (!endpoint.healthy) this.log.info({ scheduler: endpoint.address }, 'scheduler reachable again');
            endpoint.healthy = true;
            if (response?.keepaliveIntervalMs) this.intervalMs = Math.max(100, Math.floor(response.keepaliveIntervalMs / 2));
            if (!wasAnnounced) this.notifyReachable();
          }
          resolve();
        },
      );
    });
  }

  /** Some scheduler has accepted this host's latest announcement. */
  get anyReachable(): boolean {
    return this.endpoints.some((endpoint) => endpoint.announced);
  }

  /**
   * Calls `waiter` once, when a scheduler next accepts an announcement it had not (one came back, or
   * was added). Returns a function that cancels the wait.
   */
  whenReachable(waiter: () => void): () => void {
    this.reachableWaiters.add(waiter);
    return () => this.reachableWaiters.delete(waiter);
  }

  private notifyReachable(): void {
    const waiters = [...this.reachableWaiters];
    this.reachableWaiters.clear();
    for (const waiter of waiters) waiter();
  }

  /** Schedulers for a task, best first: rendezvous hashing, healthy ones before the others. */
  schedulersFor(taskId: string): string[] {
    return [...this.endpoints]
      .map((endpoint) => ({ endpoint, rank: createHash('sha256').update(`${endpoint.address}|${taskId}`).digest().readUInt32BE(0) }))
      .sort((a, b) => Number(b.endpoint.healthy) - Number(a.endpoint.healthy) || b.rank - a.rank)
      .map(({ endpoint }) => endpoint.address);
  }

  /** True once `close` ran: the peer is shutting down and opens no more streams. */
  get closed(): boolean {
    return this.shutDown;
  }

  /** Throws when the client is closed or the scheduler left the list meanwhile (grpc-js throws on a closed channel). */
  openStream(address: string): PeerStream {
    if (this.shutDown) throw new Error('the scheduler client is closed');
    const endpoint = this.endpoints.find((e) => e.address === address);
    if (!endpoint) throw new Error(`unknown scheduler ${address}`);
    return endpoint.client.AnnouncePeer(this.metadata());
  }

  /** A stream on this scheduler failed: it may have restarted and forgotten the host. */
  markUnhealthy(address: string): void {
    const endpoint = this.endpoints.find((e) => e.address === address);
    if (endpoint) {
      endpoint.healthy = false;
      endpoint.announced = false;
    }
  }

  async leave(hostId: string): Promise<void> {
    await Promise.all(
      this.endpoints.map(
        (endpoint) =>
          new Promise<void>((resolve) =>
            endpoint.client.LeaveHost({ hostId }, this.metadata(), { deadline: Date.now() + 1_000 }, () => resolve()),
          ),
      ),
    );
  }

  close(): void {
    this.shutDown = true;
    this.reachableWaiters.clear();
    if (this.keepalive) clearTimeout(this.keepalive);
    for (const endpoint of this.endpoints) endpoint.client.close();
  }
}
