/** Grammar of OCI distribution repository names and tags (distribution-spec, "Pulling manifests"). */
const NAME_COMPONENT = '[a-z0-9]+(?:(?:\\.|_|__|-+)[a-z0-9]+)*';
const REPOSITORY_NAME = new RegExp(`^${NAME_COMPONENT}(?:/${NAME_COMPONENT})*$`);
const TAG = /^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$/;
const MAX_NAME_LENGTH = 255;

export function isRepositoryName(name: string): boolean {
  return name.length <= MAX_NAME_LENGTH && REPOSITORY_NAME.test(name);
}

export function isTag(tag: string): boolean {
  return TAG.test(tag);
}

/** Says why a repository name is refused, or returns undefined when it is valid. */
export function explainBadRepositoryName(name: string): string | undefined {
  if (name.length === 0) return 'repository name is empty';
  if (name.length > MAX_NAME_LENGTH) return `repository name is longer than ${MAX_NAME_LENGTH} characters`;
  if (name.split('/').some((part) => part === '..' || part === '.')) return 'repository name contains a "." or ".." path component';
  if (!REPOSITORY_NAME.test(name)) return `invalid repository name "${name}"`;
  return undefined;
}
