import type { Credentials } from '../oci/client.js';
import type { RegistryHosts } from '../oci/registry-hosts.js';
import { LayoutStore } from './layout-store.js';
import type { ImageLocation } from './location.js';
import { RegistryStore } from './registry-store.js';
import type { ImageStore } from './store.js';

/** The store for a parsed SRC or DST; the reference is the tag or digest it names (if any). */
export function openStore(location: ImageLocation, hosts: RegistryHosts, credentials?: Credentials): ImageStore {
  return location.kind === 'oci' ? new LayoutStore(location.dir, location.tag) : new RegistryStore(location.ref, hosts, credentials);
}

/** The reference to read from SRC: what it names, or for a layout without a tag its only image. */
export async function sourceReference(store: ImageStore): Promise<string> {
  if (store.reference) return store.reference;
  if (store instanceof LayoutStore) return store.defaultReference();
  return 'latest';
}
