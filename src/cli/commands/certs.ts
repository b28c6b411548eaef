import type { Command } from 'commander';
import { UserError } from '../../common/errors.js';
import type { LeafNames } from '../../common/tls-issue.js';

/**
 * What each component's certificate names in the Kubernetes manifests (deploy/kubernetes). The
 * components check only the chain, never a name (peers are reached by IP); the names are for
 * people and their tools: curl or a browser reaching the manager through its Service or a
 * port-forward, grpcurl reaching a scheduler by its pod's DNS name.
 */
export function kubernetesLeafNames(namespace: string): Record<string, LeafNames> {
  const service = (name: string) => [name, `${name}.${namespace}`, `${name}.${namespace}.svc`, `${name}.${namespace}.svc.cluster.local`];
  return {
    manager: { commonName: 'starling-manager', dns: [...service('starling-manager'), 'localhost'], ips: ['127.0.0.1', '::1'] },
    scheduler: { commonName: 'starling-scheduler', dns: service('starling-scheduler').map((name) => `*.${name}`), ips: [] },
    // The peer DaemonSet and the seeds: reached by the node's or the pod's IP, known only at run time.
    peer: { commonName: 'starling-peer', dns: [], ips: [] },
  };
}

interface CertsFlags {
  out: string;
  namespace: string;
  days: number;
  newCa?: boolean;
  retireOldCa?: boolean;
}

export function registerCertsCommand(program: Command): void {
  program
    .command('certs')
    .description(
      'write a cluster CA and a certificate for each component (manager, scheduler, peer) into a folder, for the Kubernetes Secrets; run again to renew them',
    )
    .requiredOption(
      '--out <dir>',
      'the folder: ca.crt, ca.key, manager.crt/.key, scheduler.crt/.key, peer.crt/.key (deploy/kubernetes/base/secrets)',
    )
    .option('--namespace <name>', 'the namespace Starling runs in (names in the certificates)', 'starling')
    .option('--days <n>', "how long the components' certificates are valid", (v) => Number(v), 365)
    .option('--new-ca', 'replace the CA, step 1: a new CA in front of ca.crt, trusted with the old one; certificates unchanged')
    .option('--retire-old-ca', 'replace the CA, step 3: drop the old CA from ca.crt once every certificate is signed by the new one')
    .action(async (options: CertsFlags) => {
      if (options.newCa && options.retireOldCa) throw new UserError('--new-ca and --retire-old-ca are steps of their own: give one');
      if (!Number.isInteger(options.days) || options.days < 1)
        throw new UserError(`--days must be a whole number of days, at least 1 (got ${options.days})`);
      if (!/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(options.namespace))
        throw new UserError(`--namespace ${options.namespace} is not a Kubernetes namespace name`);
      const { writeClusterCertificates } = await import('../../common/tls-files.js');
      const done = await writeClusterCertificates(options.out, {
        leaves: kubernetesLeafNames(options.namespace),
        days: options.days,
        ca: options.newCa ? 'new' : options.retireOldCa ? 'retire' : 'keep',
      });
      for (const line of done) console.log(line);
    });
}
