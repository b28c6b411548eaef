/** Shapes of the manager's HTTP contract with peers, shared by both sides. */

/** A task a peer holds, with where its bytes came from. */
export interface PeerTaskReport {
  digest: string;
  size: number;
  complete: boolean;
  bytesFrom: { peer: number; seed: number; origin: number };
}

/** The body of `POST /api/v1/peers/keepalive`. */
export interface PeerKeepalive {
  hostId: string;
  hostname: string;
  ip: string;
  uploadPort: number;
  mirrorUrl: string;
  labels: Record<string, string>;
  seed: boolean;
  /** Replaces the peer's previous report; left out, the old one stays. */
  tasks?: PeerTaskReport[];
}
