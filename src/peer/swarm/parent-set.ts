import type { Dispatcher } from 'undici';
import type { Logger } from '../../common/log.js';
import type { ClientTls } from '../../common/tls.js';
import type { FailureReason, ParentInfo } from '../../rpc/scheduler-api.js';
import { ParentLink } from './parent-link.js';
import type { ClusterToken } from '../../common/token.js';

export interface ParentSetSettings {
  hostId: string;
  clusterToken: ClusterToken;
  tls?: ClientTls;
}

export interface ParentSetEvents {
  /** A parent offers pieces it did not offer before. */
  news(): void;
  /** A parent was dropped for `reason` (at piece `index`, or -1), and blocked for this task. */
  dropped(link: ParentLink, reason: FailureReason, message: string, index: number): void;
}

/**
 * The parents the scheduler named for one task, each followed through a ParentLink, less those
 * this peer dropped (a bad piece, unreachable): those stay blocked for the task.
 */
export class ParentSet implements Iterable<ParentLink> {
  private readonly links = new Map<string, ParentLink>();
  /** Seeds the scheduler named while this peer waits for parents: asked for spans only, not followed. */
  private readonly spanLinks = new Map<string, ParentLink>();
  private readonly blocked = new Set<string>();

  constructor(
    private readonly taskId: string,
    private readonly pieceCount: number,
    private readonly dispatcher: Dispatcher,
    private readonly settings: ParentSetSettings,
    /** The headers that let a parent authorize this peer's client (they follow the first client to ask). */
    private readonly clientHeaders: () => Record<string, string>,
    private readonly log: Logger,
    private readonly events: ParentSetEvents,
  ) {}

  [Symbol.iterator](): Iterator<ParentLink> {
    return this.links.values();
  }

  /** Some parent is a node, not a seed. */
  get hasNodeParents(): boolean {
    for (const link of this.links.values()) if (!link.seed) return true;
    return false;
  }

  /** The parents this peer dropped, for a reschedule request. */
  get blocklist(): string[] {
    return [...this.blocked];
  }

  /** The scheduler's new list: parents no longer on it retire (their pieces on the way finish), new ones are followed. */
  follow(parents: ParentInfo[]): void {
    this.log.debug({ task: this.taskId, parents: parents.map((p) => p.peerId) }, 'parents from the scheduler');
    const keep = new Set(parents.map((p) => p.peerId));
    for (const [id, link] of this.links) {
      if (!keep.has(id)) {
        link.retire();
        this.links.delete(id);
      }
    }
    for (const info of parents) {
      if (this.links.has(info.peerId) || this.blocked.has(info.peerId) || info.hostId === this.settings.hostId) continue;
      const link = this.link(info);
      this.links.set(info.peerId, link);
      link.start();
    }
  }

  /** The seeds to ask for spans while this peer has no parents (the scheduler's `wait`). */
  spanSources(infos: ParentInfo[]): void {
    const keep = new Set(infos.map((info) => info.peerId));
    for (const [id, link] of this.spanLinks) {
      if (keep.has(id)) continue;
      link.retire();
      this.spanLinks.delete(id);
    }
    for (const info of infos) {
      if (this.spanLinks.has(info.peerId) || this.blocked.has(info.peerId) || info.hostId === this.settings.hostId) continue;
      this.spanLinks.set(info.peerId, this.link(info));
    }
  }

  /** Links to ask for a span: the parents, then the seeds named for spans. */
  forSpans(): ParentLink[] {
    return [...this.links.values(), ...this.spanLinks.values()];
  }

  /** Stops using a parent for this task: closed at once (its pieces on the way too) and blocked. */
  drop(link: ParentLink, reason: FailureReason, message: string, index = -1): void {
    if (!this.links.has(link.id)) return;
    link.close();
    this.links.delete(link.id);
    this.blocked.add(link.id);
    this.log.warn({ task: this.taskId, parent: link.id, reason, message }, 'dropping parent');
    this.events.dropped(link, reason, message, index);
  }

  /** Closes every parent (the download finished or left the task). */
  closeAll(): void {
    for (const link of [...this.links.values(), ...this.spanLinks.values()]) link.close();
    this.links.clear();
    this.spanLinks.clear();
  }

  private link(info: ParentInfo): ParentLink {
    return new ParentLink(
      info,
      this.taskId,
      this.pieceCount,
      this.dispatcher,
      { authorization: this.settings.clusterToken.authorization, ...this.clientHeaders() },
      this.settings.tls,
      this.log,
      () => this.events.news(),
      (dead, error) => this.drop(dead, 'FAILURE_REASON_PARENT_UNREACHABLE', error.message),
    );
  }
}
