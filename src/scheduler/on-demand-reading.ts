/**
 * Which registries' swarms are fetching pieces that workloads wait for. Nodes that start one
 * lazily pulled image together read what their workloads need for tens of seconds; those ready
 * first then fill their caches in the background. A seed sees only its own children's reads, so
 * once the nodes read from each other it took the swarm for quiet and fetched the early nodes'
 * background pieces from the registry while the last ones still started (8 nodes end to end: the
 * registry sent 2.1–3.7 copies of the bytes the starts needed by the last ready line, against 1.48
 * without background fetch). The scheduler hears every peer's piece starts, so it says to every
 * peer of the registry when this begins and ends (SwarmReading), and background fetches wait.
 */

/**
 * How long after the last piece a workload waited for arrived the registry's swarm counts as
 * quiet. Longer than a workload's start after its last awaited piece: twelve nodes on two cores
 * ran theirs 3.4-5.5 s from cache before the ready line, and with 3 s the nodes ready first
 * fetched their background pieces from the registry meanwhile (1.21 copies of the bytes the starts
 * needed). A late read a workload then makes finds the registry's link free. Background fetch
 * waits this much longer once, after the starts, against minutes for the whole image.
 */
export const ON_DEMAND_QUIET_MS = 10_000;

export class OnDemandReading {
  /** Registry → when a piece a workload waits for last began arriving at one of its peers. */
  private readonly lastDemand = new Map<string, number>();

  /** A piece a workload waits for began arriving at a peer of `registry`: true when its swarm was quiet until now. */
  demanded(registry: string, now: number): boolean {
    const quiet = !this.lastDemand.has(registry);
    this.lastDemand.set(registry, now);
    return quiet;
  }

  /** Whether the registry's swarm is fetching pieces workloads wait for. */
  reading(registry: string): boolean {
    return this.lastDemand.has(registry);
  }

  /**
   * The registries whose swarms have gone quiet by `now`: no longer reading. A swarm with a piece a
   * workload waits for still on its way (`stillArriving`) is not quiet, however long ago that piece
   * began: at 10 Mbit/s a 4 MiB piece takes over 3 s, and twelve nodes whose last pieces were
   * still arriving were taken for quiet, so the nodes ready first fetched their background pieces
   * from the registry while the last ones started (1.26-1.58 copies of the bytes the starts needed).
   */
  quietened(now: number, stillArriving: (registry: string) => boolean): string[] {
    const quiet: string[] = [];
    for (const [registry, at] of this.lastDemand) {
      if (now - at < ON_DEMAND_QUIET_MS) continue;
      if (stillArriving(registry)) {
        this.lastDemand.set(registry, now);
        continue;
      }
      this.lastDemand.delete(registry);
      quiet.push(registry);
    }
    return quiet;
  }
}
