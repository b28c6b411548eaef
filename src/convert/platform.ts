import { UserError } from '../common/errors.js';

export interface Platform {
  os: string;
  architecture: string;
  variant?: string;
}

/** The default platform to convert from an index: this host's, as containerd would pull. */
export function hostPlatform(): Platform {
  const architecture =
    ({ x64: 'amd64', arm64: 'arm64', arm: 'arm', ia32: '386', ppc64: 'ppc64le', s390x: 's390x' } as Record<string, string>)[process.arch] ??
    process.arch;
  return { os: process.platform === 'win32' ? 'windows' : process.platform, architecture };
}

/** Parses `os/arch[/variant]`, e.g. linux/amd64 or linux/arm64/v8. */
export function parsePlatform(text: string): Platform {
  const parts = text.split('/');
  const [os, architecture, variant] = parts;
  if (os === undefined || architecture === undefined || parts.length > 3 || parts.some((p) => !/^[a-z0-9_.-]+$/.test(p))) {
    throw new UserError(`--platform "${text}" must be os/architecture[/variant], e.g. linux/amd64`);
  }
  return { os, architecture, variant };
}

export function formatPlatform(p: Partial<Platform> | undefined): string {
  if (!p) return 'unknown';
  return [p.os ?? '?', p.architecture ?? '?', p.variant].filter(Boolean).join('/');
}

/** A variant is compared only when the wanted platform names one. */
export function platformMatches(candidate: Partial<Platform> | undefined, wanted: Platform): boolean {
  return (
    candidate?.os === wanted.os &&
    candidate.architecture === wanted.architecture &&
    (!wanted.variant || candidate.variant === wanted.variant)
  );
}
