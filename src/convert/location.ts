import { UserError } from '../common/errors.js';
import { parseImageReference, type ImageReference } from '../oci/reference.js';

/** Where an image is read from or written to: a registry, or an OCI image layout directory. */
export type ImageLocation =
  { kind: 'registry'; ref: ImageReference; text: string } | { kind: 'oci'; dir: string; tag?: string; text: string };

/** Parses `oci:DIR[:TAG]` or a registry reference (`registry/repo[:tag][@digest]`). */
export function parseLocation(text: string, role: 'source' | 'destination'): ImageLocation {
  if (text.startsWith('oci:')) {
    const rest = text.slice(4);
    // The tag is what follows the last ':' when no '/' follows it (DIR itself may hold ':').
    const colon = rest.lastIndexOf(':');
    const [dir, tag] = colon > 0 && !rest.slice(colon).includes('/') ? [rest.slice(0, colon), rest.slice(colon + 1)] : [rest, undefined];
    if (!dir) throw new UserError(`${role} "${text}": oci: needs a directory`);
    if (tag !== undefined && !/^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$/.test(tag))
      throw new UserError(`${role} "${text}": invalid tag "${tag}"`);
    return { kind: 'oci', dir, tag, text };
  }
  let ref: ImageReference;
  try {
    ref = parseImageReference(text);
  } catch (error) {
    throw new UserError(`${role} "${text}": ${(error as Error).message}`);
  }
  if (role === 'destination' && ref.digest)
    throw new UserError(`destination "${text}" names a digest; give a tag (the converted image has a new digest)`);
  return { kind: 'registry', ref, text };
}
