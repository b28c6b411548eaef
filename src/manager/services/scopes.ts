import { BlockList, isIP } from 'node:net';
import { z } from 'zod';

/**
 * Which peers a scheduler cluster serves. A peer matches a cluster when its `zone` label is one
 * of `zones`, its address is in one of `cidrs`, or its hostname matches one of the `hostnames`
 * globs (`*` any run of characters, `?` one character).
 */
const zones = z.array(z.string().min(1, 'must not be empty'));
const cidrs = z.array(
  z.string().refine((value) => parseCidr(value) !== undefined, { message: 'must be a CIDR such as 10.1.0.0/16 or fd00::/8' }),
);
const hostnames = z.array(
  z
    .string()
    .min(1, 'must not be empty')
    .regex(/^[A-Za-z0-9.*?_-]+$/, 'must be a hostname glob (letters, digits, . - _ * ?)'),
);

export const clusterScopesSchema = z
  .object({ zones: zones.default([]), cidrs: cidrs.default([]), hostnames: hostnames.default([]) })
  .strict();

/** A change of scopes: the lists given replace the current ones, the others stay. */
export const clusterScopesPatchSchema = z
  .object({ zones: zones.optional(), cidrs: cidrs.optional(), hostnames: hostnames.optional() })
  .strict();

export type ClusterScopes = z.output<typeof clusterScopesSchema>;

export interface Cidr {
  address: string;
  prefix: number;
  family: 'ipv4' | 'ipv6';
}

export function parseCidr(text: string): Cidr | undefined {
  const [, address, prefixText] = /^([^/]+)\/(\d{1,3})$/.exec(text.trim()) ?? [];
  if (address === undefined) return undefined;
  const version = isIP(address);
  const prefix = Number(prefixText);
  if (version === 0 || prefix > (version === 4 ? 32 : 128)) return undefined;
  return { address, prefix, family: version === 4 ? 'ipv4' : 'ipv6' };
}

export function cidrContains(cidr: Cidr, ip: string): boolean {
  const version = isIP(ip);
  if (version === 0) return false;
  const list = new BlockList();
  list.addSubnet(cidr.address, cidr.prefix, cidr.family);
  return list.check(ip, version === 4 ? 'ipv4' : 'ipv6');
}

export function globMatches(glob: string, hostname: string): boolean {
  const pattern = glob
    .replace(/[.+^${}()|[\]\\-]/g, '\\$&')
    .replace(/\*/g, '.*')
    .replace(/\?/g, '.');
  return new RegExp(`^${pattern}$`, 'i').test(hostname);
}

export interface ScopedCluster {
  id: number;
  scopes: ClusterScopes;
  isDefault: boolean;
}

export interface PeerPlace {
  ip: string;
  hostname: string;
  labels: Record<string, string>;
}

/**
 * How precisely a cluster names this peer, or undefined when it does not. A hostname glob names
 * hosts more precisely than a CIDR, and a CIDR more than a zone; within a kind, the glob with more
 * literal characters and the longer prefix win. Compared as [kind, precision].
 */
export function specificity(scopes: ClusterScopes, peer: PeerPlace): [number, number] | undefined {
  let best: [number, number] | undefined;
  const offer = (candidate: [number, number]) => {
    if (!best || candidate[0] > best[0] || (candidate[0] === best[0] && candidate[1] > best[1])) best = candidate;
  };
  for (const glob of scopes.hostnames) {
    if (globMatches(glob, peer.hostname)) offer([3, glob.replace(/[*?]/g, '').length]);
  }
  for (const text of scopes.cidrs) {
    const cidr = parseCidr(text);
    if (cidr && cidrContains(cidr, peer.ip)) offer([2, cidr.prefix]);
  }
  const zone = peer.labels.zone;
  if (zone !== undefined && scopes.zones.includes(zone)) offer([1, 0]);
  return best;
}

/** The cluster serving a peer: the most specific match, else the default cluster (lowest id breaks ties). */
export function matchCluster(clusters: ScopedCluster[], peer: PeerPlace): number | undefined {
  let chosen: { id: number; score: [number, number] } | undefined;
  for (const cluster of [...clusters].sort((a, b) => a.id - b.id)) {
    const score = specificity(cluster.scopes, peer);
    if (!score) continue;
    if (!chosen || score[0] > chosen.score[0] || (score[0] === chosen.score[0] && score[1] > chosen.score[1]))
      chosen = { id: cluster.id, score };
  }
  return chosen?.id ?? clusters.find((c) => c.isDefault)?.id;
}
