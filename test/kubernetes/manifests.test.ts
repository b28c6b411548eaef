// deploy/kubernetes renders with kubectl's kustomize (as `kubectl apply -k` would), every object
// validates against the Kubernetes OpenAPI schema (kubernetes-models) and a strict pass that
// fails on misspelt fields, and the objects say what the design asks of them.
import assert from 'node:assert/strict';
import { X509Certificate, createPrivateKey } from 'node:crypto';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { parseAllDocuments } from 'yaml';
import { kubernetesLeafNames } from '../../src/cli/commands/certs.js';
import { itemAt } from '../../src/common/indexing.js';
import { writeClusterCertificates } from '../../src/common/tls-files.js';
import { makeTempDir, run, type TempDir } from '../fixtures/processes.js';
import { schemaErrors, unknownFieldErrors, type KubeObject } from './manifest-check.js';

const DEPLOY = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../deploy/kubernetes');
/** Nodes whose containerd is k3s's or RKE2's own: each has a component (components/k3s, components/rke2). */
const FLAVOURS = ['k3s', 'rke2'] as const;

// Rendered objects are walked as plain JSON.
type Obj = KubeObject & Record<string, any>;

describe('deploy/kubernetes', () => {
  let tmp: TempDir;
  const rendered: Record<string, Obj[]> = {};

  /** `kubectl kustomize` of a folder under the temp copy; throws with kustomize's message. */
  async function render(dir: string): Promise<Obj[]> {
    const result = await run('kubectl', ['kustomize', path.join(tmp.path, dir)]);
    assert.equal(result.code, 0, `kubectl kustomize ${dir}: ${result.stderr}`);
    return parseAllDocuments(result.stdout).map((doc) => doc.toJSON() as Obj);
  }

  before(async () => {
    // A copy with the secret files an operator creates; the repository holds none.
    tmp = await makeTempDir('starling-manifests-');
    await fsp.cp(DEPLOY, tmp.path, { recursive: true });
    for (const file of [
      'base/secrets/cluster-token',
      'base/secrets/admin-token',
      'overlays/ha/secrets/postgres-url',
      'overlays/ha-trial/secrets/postgres-password',
    ]) {
      await fsp.writeFile(path.join(tmp.path, file), 'generated-by-the-test');
    }
    // The certificates as the README makes them.
    await writeClusterCertificates(path.join(tmp.path, 'components/tls-files/secrets'), {
      leaves: kubernetesLeafNames('starling'),
      days: 365,
      ca: 'keep',
    });
    // The lazy component added to each overlay as the README says: its line there uncommented.
    for (const overlay of ['default', 'ha']) {
      const dir = path.join(tmp.path, 'overlays', `${overlay}-lazy`);
      await fsp.cp(path.join(tmp.path, 'overlays', overlay), dir, { recursive: true });
      const file = path.join(dir, 'kustomization.yaml');
      const text = await fsp.readFile(file, 'utf8');
      const lazy = text.replace(/^ {2}# - \.\.\/\.\.\/components\/lazy$/m, '  - ../../components/lazy');
      assert.notEqual(lazy, text, `${overlay}: a commented line for the lazy component`);
      await fsp.writeFile(file, lazy);
    }
    // cert-manager instead of the certificate files, as the README says: one component for the other.
    {
      const dir = path.join(tmp.path, 'overlays', 'default-cert-manager');
      await fsp.cp(path.join(tmp.path, 'overlays', 'default'), dir, { recursive: true });
      const file = path.join(dir, 'kustomization.yaml');
      const text = await fsp.readFile(file, 'utf8');
      const swapped = text.replace(/^ {2}- \.\.\/\.\.\/components\/tls-files$/m, '  - ../../components/cert-manager');
      assert.notEqual(swapped, text, 'default: a line for the tls-files component');
      await fsp.writeFile(file, swapped);
    }
    // k3s and RKE2 nodes, as the README says: their component added to the overlay (with lazy
    // pulling here) and uncommented in the uninstall kustomization.
    for (const flavour of FLAVOURS) {
      const dir = path.join(tmp.path, 'overlays', `default-lazy-${flavour}`);
      await fsp.cp(path.join(tmp.path, 'overlays', 'default-lazy'), dir, { recursive: true });
      const file = path.join(dir, 'kustomization.yaml');
      const text = await fsp.readFile(file, 'utf8');
      await fsp.writeFile(file, text.replace(/^( {2}- \.\.\/\.\.\/components\/lazy\n)/m, `$1  - ../../components/${flavour}\n`));
      const uninstall = path.join(tmp.path, `uninstall-${flavour}`);
      await fsp.mkdir(uninstall);
      await fsp.cp(path.join(tmp.path, 'uninstall', 'node-undo.yaml'), path.join(uninstall, 'node-undo.yaml'));
      const undoText = await fsp.readFile(path.join(tmp.path, 'uninstall', 'kustomization.yaml'), 'utf8');
      const uncommented = undoText.replace(new RegExp(`^ {2}# - \\.\\./components/${flavour}$`, 'm'), `  - ../components/${flavour}`);
      assert.notEqual(uncommented, undoText, `uninstall: a commented line for the ${flavour} component`);
      await fsp.writeFile(path.join(uninstall, 'kustomization.yaml'), uncommented);
    }
    for (const overlay of [
      'default',
      'ha',
      'ha-trial',
      'default-lazy',
      'ha-lazy',
      'default-cert-manager',
      ...FLAVOURS.map((f) => `default-lazy-${f}`),
    ])
      rendered[overlay] = await render(`overlays/${overlay}`);
    rendered.uninstall = await render('uninstall');
    for (const flavour of FLAVOURS) rendered[`uninstall-${flavour}`] = await render(`uninstall-${flavour}`);
  });

  after(async () => {
    await tmp?.remove();
  });

  const all = () => Object.values(rendered).flat();
  const objectsOf = (overlay: string): Obj[] => {
    const objects = rendered[overlay];
    assert.ok(objects, `the ${overlay} manifests were rendered`);
    return objects;
  };
  const find = (overlay: string, kind: string, name: string): Obj => {
    const object = objectsOf(overlay).find((o) => o.kind === kind && o.metadata.name === name);
    assert.ok(object, `${overlay}: ${kind}/${name}`);
    return object;
  };
  const podSpec = (object: Obj) => object.spec.template.spec;
  const container = (object: Obj, name: string) =>
    [...(podSpec(object).initContainers ?? []), ...podSpec(object).containers].find((c: any) => c.name === name);

  test('every overlay renders, and every object validates against the Kubernetes schema', () => {
    assert.ok(all().length > 60, `rendered ${all().length} objects`);
    const errors = all().flatMap(schemaErrors);
    assert.deepEqual(errors, []);
  });

  test('no object holds a field the schema does not know (a strict pass kubernetes-models does not make)', () => {
    const errors = unknownFieldErrors(all());
    assert.deepEqual(errors, []);
  });

  test('the checks catch a misspelt field and a wrong type', () => {
    const peer = structuredClone(find('default', 'DaemonSet', 'starling-peer'));
    podSpec(peer).hostNetwrok = true;
    assert.deepEqual(schemaErrors(peer), [], 'kubernetes-models lets an unknown field through');
    assert.match(unknownFieldErrors([peer]).join('\n'), /DaemonSet\/starling-peer: .*'"?hostNetwrok"?' does not exist in type 'IPodSpec'/);
    const nested = structuredClone(find('default', 'DaemonSet', 'starling-peer'));
    container(nested, 'peer').readinessProbe.httpGet.pth = '/healthz';
    assert.match(unknownFieldErrors([nested]).join('\n'), /'"?pth"?' does not exist in type 'IHTTPGetAction'/);
    const typed = structuredClone(find('default', 'DaemonSet', 'starling-peer'));
    podSpec(typed).hostNetwork = 'true';
    assert.match(schemaErrors(typed).join('\n'), /hostNetwork must be boolean/);
  });

  test('no container is given the same flag twice (a patch that added instead of replaced)', () => {
    for (const object of all().filter((o) => o.spec?.template?.spec)) {
      for (const c of [...(podSpec(object).initContainers ?? []), ...podSpec(object).containers]) {
        const flags = (c.args ?? []).filter((a: string) => a.startsWith('--')).map((a: string) => a.split('=')[0]);
        assert.deepEqual(flags, [...new Set(flags)], `${object.kind}/${object.metadata.name} ${c.name}: ${flags.join(' ')}`);
      }
    }
  });

  test('the peer DaemonSet: host network, node-critical, every taint tolerated, a partial rolling update, probes on /healthz, resources, the token from a Secret', () => {
    const peer = find('default', 'DaemonSet', 'starling-peer');
    const spec = podSpec(peer);
    assert.equal(spec.hostNetwork, true);
    assert.equal(spec.dnsPolicy, 'ClusterFirstWithHostNet');
    assert.equal(spec.priorityClassName, 'system-node-critical');
    assert.deepEqual(spec.tolerations, [{ operator: 'Exists' }]);
    assert.equal(peer.spec.updateStrategy.type, 'RollingUpdate');
    assert.notEqual(peer.spec.updateStrategy.rollingUpdate.maxUnavailable, '100%');
    const main = container(peer, 'peer');
    assert.ok(main.args.includes('--mirror-listen=127.0.0.1:65001'));
    assert.ok(main.args.includes('--upload-listen=$(NODE_IP):65002'));
    assert.deepEqual(main.env.find((e: any) => e.name === 'NODE_IP').valueFrom, { fieldRef: { fieldPath: 'status.hostIP' } });
    for (const probe of [main.readinessProbe, main.livenessProbe])
      assert.deepEqual(probe.httpGet, { host: '127.0.0.1', path: '/healthz', port: 65001 });
    for (const c of [...spec.initContainers, ...spec.containers])
      assert.ok(c.resources?.requests && c.resources?.limits?.memory, `${c.name} has resources`);
    const token = spec.volumes.find((v: any) => v.name === 'cluster-token');
    assert.match(token.secret.secretName, /^starling-cluster-token-[a-z0-9]{10}$/, 'a generated Secret (name with its content hash)');
    assert.deepEqual(container(peer, 'node-setup').args.slice(0, 2), ['node-setup', '--containerd-config=/etc/containerd/config.toml']);
    assert.ok(container(peer, 'node-labels').args.includes('--rack-label=$(RACK_LABEL)'));
    assert.ok(main.args.includes('--labels-file=/etc/starling/node/labels.yaml'));
  });

  test('Secrets are generated, never written in a manifest', async () => {
    // The tokens carry their content's hash, so pods roll when one changes; the database Secrets keep
    // a fixed name (kustomize does not rename references that a patch adds).
    const names = all()
      .filter((o) => o.kind === 'Secret')
      .map((o) => o.metadata.name.replace(/-[a-z0-9]{10}$/, '-<hash>'));
    assert.deepEqual([...new Set(names)].sort(), [
      'starling-admin-token-<hash>',
      'starling-cluster-token-<hash>',
      'starling-manager-db',
      'starling-manager-tls-<hash>',
      'starling-peer-tls-<hash>',
      'starling-postgres',
      'starling-scheduler-tls-<hash>',
    ]);
    const sources = (await fsp.readdir(DEPLOY, { recursive: true })).filter((f) => f.endsWith('.yaml'));
    for (const file of sources) assert.doesNotMatch(await fsp.readFile(path.join(DEPLOY, file), 'utf8'), /^kind: Secret$/m, file);
  });

  test('default: one manager on SQLite with a PVC, one scheduler behind a headless Service, one seed with a PVC; PDBs and NetworkPolicies', () => {
    const manager = find('default', 'Deployment', 'starling-manager');
    assert.equal(manager.spec.replicas, 1);
    assert.equal(podSpec(manager).volumes.find((v: any) => v.name === 'data').persistentVolumeClaim.claimName, 'starling-manager');
    assert.equal(podSpec(manager).securityContext.runAsNonRoot, true);
    const scheduler = find('default', 'StatefulSet', 'starling-scheduler');
    assert.equal(scheduler.spec.replicas, 1);
    assert.equal(podSpec(scheduler).securityContext.runAsNonRoot, true);
    assert.equal(find('default', 'Service', 'starling-scheduler').spec.clusterIP, 'None');
    const seed = find('default', 'StatefulSet', 'starling-seed');
    assert.equal(seed.spec.replicas, 1);
    assert.ok(container(seed, 'seed').args.includes('--seed'));
    assert.equal(seed.spec.volumeClaimTemplates[0].metadata.name, 'data');
    for (const name of ['starling-manager', 'starling-scheduler', 'starling-seed']) find('default', 'PodDisruptionBudget', name);
    const schedulerPolicy = find('default', 'NetworkPolicy', 'starling-scheduler');
    assert.deepEqual(schedulerPolicy.spec.ingress[0].ports, [{ port: 8002 }]);
  });

  test('ha: three managers on PostgreSQL (URL from a Secret, or a bundled StatefulSet), three schedulers every peer lists, two seeds', () => {
    for (const overlay of ['ha', 'ha-trial']) {
      const manager = find(overlay, 'Deployment', 'starling-manager');
      assert.equal(manager.spec.replicas, 3);
      assert.equal(container(manager, 'manager').env.at(-1).name, 'STARLING_MANAGER_DB', 'the database URL, kept off the command line');
      assert.equal(container(manager, 'manager').readinessProbe.httpGet.path, '/readyz');
      assert.equal(
        objectsOf(overlay).some((o) => o.kind === 'PersistentVolumeClaim'),
        false,
        `${overlay}: no SQLite volume`,
      );
      assert.equal(find(overlay, 'StatefulSet', 'starling-scheduler').spec.replicas, 3);
      assert.equal(find(overlay, 'StatefulSet', 'starling-seed').spec.replicas, 2);
      const three =
        '--scheduler=starling-scheduler-0.starling-scheduler:8002,starling-scheduler-1.starling-scheduler:8002,starling-scheduler-2.starling-scheduler:8002';
      assert.ok(container(find(overlay, 'DaemonSet', 'starling-peer'), 'peer').args.includes(three));
      assert.ok(container(find(overlay, 'StatefulSet', 'starling-seed'), 'seed').args.includes(three));
    }
    const external = container(find('ha', 'Deployment', 'starling-manager'), 'manager').env;
    assert.equal(external[0].valueFrom.secretKeyRef.name, 'starling-manager-db');
    const trial = container(find('ha-trial', 'Deployment', 'starling-manager'), 'manager').env;
    assert.deepEqual(
      trial.map((e: any) => e.name),
      ['PGPASSWORD', 'STARLING_MANAGER_DB'],
      'the password is defined before the URL that uses it',
    );
    assert.equal(trial[0].valueFrom.secretKeyRef.name, 'starling-postgres');
    assert.ok(objectsOf('ha-trial').some((o) => o.kind === 'Secret' && o.metadata.name === 'starling-postgres'));
    find('ha-trial', 'StatefulSet', 'starling-postgres');
  });

  test('lazy: the snapshotter DaemonSet (privileged, /dev/fuse, bidirectional propagation, its FUSE server in its own container) and node-setup --lazy', () => {
    for (const overlay of ['default-lazy', 'ha-lazy']) {
      const snapshotter = find(overlay, 'DaemonSet', 'starling-snapshotter');
      const spec = podSpec(snapshotter);
      assert.deepEqual(
        spec.containers.map((c: any) => c.name),
        ['fuse-server', 'snapshotter'],
      );
      for (const c of spec.containers) {
        assert.equal(c.securityContext.privileged, true);
        assert.equal(c.volumeMounts.find((m: any) => m.name === 'root').mountPropagation, 'Bidirectional');
        assert.ok(c.volumeMounts.some((m: any) => m.mountPath === '/dev/fuse'));
      }
      assert.equal(spec.volumes.find((v: any) => v.name === 'fuse').hostPath.type, 'CharDevice');
      const setup = container(find(overlay, 'DaemonSet', 'starling-peer'), 'node-setup');
      assert.ok(setup.args.includes('--lazy'));
      assert.ok(setup.args.includes('--snapshotter-socket=/run/starling/snapshotter.sock'));
    }
    assert.equal(
      objectsOf('default').some((o) => o.metadata.name === 'starling-snapshotter'),
      false,
    );
  });

  /** The workloads of Starling's own components and their main container, in every overlay. */
  const workloads = [
    ['Deployment', 'starling-manager', 'manager'],
    ['StatefulSet', 'starling-scheduler', 'scheduler'],
    ['StatefulSet', 'starling-seed', 'seed'],
    ['DaemonSet', 'starling-peer', 'peer'],
  ] as const;
  const components = () =>
    Object.keys(rendered)
      .filter((overlay) => !overlay.startsWith('uninstall'))
      .flatMap((overlay) =>
        workloads.map(([kind, name, main]) => {
          const object = find(overlay, kind, name);
          return { overlay, object, main: container(object, main) };
        }),
      );
  const flag = (c: any, name: string): string | undefined =>
    (c.args ?? []).find((a: string) => a.startsWith(`${name}=`))?.slice(name.length + 1);
  const decode = (secret: Obj, key: string) => Buffer.from(secret.data[key], 'base64');

  test('TLS between components: each has the three flags, its own Secret mounted where they point, and a certificate the cluster CA signed', () => {
    const cas = new Set<string>();
    for (const { overlay, object, main } of components().filter((c) => c.overlay !== 'default-cert-manager')) {
      const where = `${overlay} ${object.metadata.name}`;
      const secretOf =
        { 'starling-manager': 'starling-manager-tls', 'starling-scheduler': 'starling-scheduler-tls' }[object.metadata.name] ??
        'starling-peer-tls';
      for (const name of ['--tls-cert', '--tls-key', '--tls-ca']) {
        const file = flag(main, name);
        assert.ok(file, `${where}: ${name}`);
        const mount = main.volumeMounts.find((m: any) => m.mountPath === path.dirname(file));
        assert.ok(mount, `${where}: ${file} is in a mounted volume`);
        const volume = podSpec(object).volumes.find((v: any) => v.name === mount.name);
        assert.match(
          volume.secret?.secretName ?? '',
          new RegExp(`^${secretOf}-[a-z0-9]{10}$`),
          `${where}: ${name} from the generated Secret ${secretOf}`,
        );
        const secret = find(overlay, 'Secret', volume.secret.secretName);
        assert.equal(secret.type, 'kubernetes.io/tls');
        assert.ok(secret.data[path.basename(file)], `${where}: ${secret.metadata.name} has ${path.basename(file)}`);
      }
      const secret = find(overlay, 'Secret', podSpec(object).volumes.find((v: any) => v.name === 'tls').secret.secretName);
      const ca = new X509Certificate(decode(secret, 'ca.crt'));
      assert.ok(new X509Certificate(decode(secret, 'tls.crt')).verify(ca.publicKey), `${where}: tls.crt signed by ca.crt`);
      assert.ok(
        new X509Certificate(decode(secret, 'tls.crt')).checkPrivateKey(createPrivateKey(decode(secret, 'tls.key'))),
        `${where}: tls.key is tls.crt's`,
      );
      cas.add(ca.fingerprint256);
    }
    assert.equal(cas.size, 1, 'one cluster CA');
  });

  test('cert-manager instead of files: a Certificate for each TLS Secret the workloads mount, with the names starling certs gives, from the cluster CA', () => {
    const objects = objectsOf('default-cert-manager');
    assert.equal(
      objects.some((o) => o.kind === 'Secret' && /-tls-/.test(o.metadata.name)),
      false,
      'no generated TLS Secret',
    );
    const certificates = objects.filter((o) => o.kind === 'Certificate');
    const leaves = kubernetesLeafNames('starling');
    for (const { object, main } of components().filter((c) => c.overlay === 'default-cert-manager')) {
      const secretName = podSpec(object).volumes.find((v: any) => v.name === 'tls').secret.secretName;
      assert.ok(flag(main, '--tls-cert')?.startsWith('/etc/starling/tls/'));
      const certificate = certificates.find((c) => c.spec.secretName === secretName);
      assert.ok(certificate, `${object.metadata.name}: a Certificate writes ${secretName}`);
      const names = leaves[secretName.replace(/^starling-|-tls$/g, '')];
      assert.ok(names, `${secretName}: names from starling certs`);
      assert.equal(certificate.spec.commonName, names.commonName);
      assert.deepEqual(certificate.spec.dnsNames ?? [], names.dns, `${secretName}: the names starling certs gives`);
      assert.deepEqual(certificate.spec.ipAddresses ?? [], names.ips);
      assert.deepEqual([...certificate.spec.usages].sort(), ['client auth', 'digital signature', 'key encipherment', 'server auth']);
      const issuer = objects.find((o) => o.kind === 'Issuer' && o.metadata.name === certificate.spec.issuerRef.name);
      assert.ok(issuer?.spec.ca, `${secretName}: signed by a CA Issuer`);
      const ca = certificates.find((c) => c.spec.secretName === issuer.spec.ca.secretName);
      assert.equal(ca?.spec.isCA, true, 'whose CA cert-manager makes');
    }
  });

  test("no plain http:// URL between components: --manager is https://, and http:// reaches only the node's own loopback", () => {
    for (const object of all().filter((o) => o.spec?.template?.spec)) {
      for (const c of [...(podSpec(object).initContainers ?? []), ...podSpec(object).containers]) {
        for (const arg of c.args ?? []) {
          const manager = /^--manager=(.*)$/.exec(arg);
          if (manager) assert.match(itemAt(manager, 1), /^https:\/\//, `${object.metadata.name} ${c.name}: ${arg}`);
          for (const url of String(arg).match(/http:\/\/[^\s,]+/g) ?? []) {
            assert.match(new URL(url).hostname, /^(127\.0\.0\.1|localhost|\[::1\])$/, `${object.metadata.name} ${c.name}: ${arg}`);
          }
        }
      }
    }
  });

  /** Ports a container listens on, from its --*listen flags: which are on loopback, which speak TLS. */
  const listening = (c: any) =>
    (c.args ?? []).flatMap((arg: string) => {
      const match = /^--([a-z]+-)?listen=(.*):(\d+)$/.exec(arg);
      if (!match) return [];
      const [, kind, host, port] = match;
      // TLS on the manager's API, the scheduler's gRPC and the upload port; the mirror and metrics stay plain.
      const tls = Boolean(flag(c, '--tls-cert')) && (kind === undefined || kind === 'upload-');
      return [{ port: Number(port), loopback: host === '127.0.0.1', tls }];
    });

  test("probes use the scheme of the port they reach: HTTPS on the manager's API and a seed's upload port, HTTP on the loopback mirror and the scheduler's metrics", () => {
    for (const { overlay, object, main } of components()) {
      for (const probe of [main.readinessProbe, main.livenessProbe]) {
        const port =
          typeof probe.httpGet.port === 'number'
            ? probe.httpGet.port
            : main.ports.find((p: any) => p.name === probe.httpGet.port)?.containerPort;
        const listener = listening(main).find((l: any) => l.port === port);
        assert.ok(listener, `${overlay} ${object.metadata.name}: the probe's port ${probe.httpGet.port} is one it listens on`);
        assert.equal(
          probe.httpGet.scheme ?? 'HTTP',
          listener.tls ? 'HTTPS' : 'HTTP',
          `${overlay} ${object.metadata.name}: probe on ${port}`,
        );
        // kubelet probes a pod's IP, unless the pod is on the host network and the probe names 127.0.0.1.
        if (listener.loopback)
          assert.equal(
            podSpec(object).hostNetwork && probe.httpGet.host,
            '127.0.0.1',
            `${object.metadata.name}: a loopback probe from the host network`,
          );
      }
    }
    assert.equal(container(find('default', 'Deployment', 'starling-manager'), 'manager').readinessProbe.httpGet.scheme, 'HTTPS');
    assert.equal(container(find('default', 'StatefulSet', 'starling-seed'), 'seed').livenessProbe.httpGet.port, 'upload');
  });

  test("a seed's mirror stays on its loopback, and Services and NetworkPolicies open only ports a pod listens on beyond it", () => {
    assert.equal(flag(container(find('default', 'StatefulSet', 'starling-seed'), 'seed'), '--mirror-listen'), '127.0.0.1:65001');
    for (const [overlay, objects] of Object.entries(rendered)) {
      const pods = objects.filter((o) => o.spec?.template?.spec);
      /** Ports the pods that `selector` picks listen on, apart from their loopback. */
      const open = (selector: Record<string, string>) =>
        pods
          .filter((o) => Object.entries(selector).every(([k, v]) => o.spec.template.metadata.labels?.[k] === v))
          .flatMap((o) => podSpec(o).containers)
          .flatMap((c: any) => {
            const listeners = listening(c);
            const loopback = listeners.filter((l: any) => l.loopback).map((l: any) => l.port);
            return [
              ...listeners.filter((l: any) => !l.loopback).map((l: any) => l.port),
              ...(c.ports ?? []).map((p: any) => p.containerPort),
            ].filter((p) => !loopback.includes(p));
          });
      for (const policy of objects.filter((o) => o.kind === 'NetworkPolicy')) {
        const ports = open(policy.spec.podSelector.matchLabels);
        for (const rule of policy.spec.ingress)
          for (const { port } of rule.ports)
            assert.ok(
              ports.includes(port),
              `${overlay} NetworkPolicy ${policy.metadata.name}: port ${port} (pods listen on ${ports.join(', ')})`,
            );
      }
      for (const service of objects.filter((o) => o.kind === 'Service')) {
        const ports = open(service.spec.selector);
        for (const { port } of service.spec.ports)
          assert.ok(ports.includes(port), `${overlay} Service ${service.metadata.name}: port ${port} (pods listen on ${ports.join(', ')})`);
      }
    }
  });

  test('every namespaced object lands in the starling namespace, generated ones included', () => {
    const clusterWide = ['Namespace', 'ClusterRole', 'ClusterRoleBinding'];
    for (const [overlay, objects] of Object.entries(rendered)) {
      for (const object of objects.filter((o) => !clusterWide.includes(o.kind))) {
        assert.equal(object.metadata.namespace, 'starling', `${overlay}: ${object.kind}/${object.metadata.name}`);
      }
    }
  });

  test('uninstall runs node-setup --undo on every node', () => {
    const undo = find('uninstall', 'DaemonSet', 'starling-node-undo');
    assert.deepEqual(container(undo, 'node-undo').args, ['node-setup', '--undo', '--containerd-config=/etc/containerd/config.toml']);
    assert.deepEqual(podSpec(undo).tolerations, [{ operator: 'Exists' }]);
  });

  /** The folder node-setup is given, its mount, and the host folder behind it, of one container. */
  const containerdFolder = (object: Obj, name: string) => {
    const c = container(object, name);
    const config = c.args.find((a: string) => a.startsWith('--containerd-config='))?.slice('--containerd-config='.length);
    const mount = c.volumeMounts.find((m: any) => m.name === 'containerd-config');
    const volume = podSpec(object).volumes.find((v: any) => v.name === 'containerd-config');
    return { config, mountPath: mount?.mountPath, hostPath: volume?.hostPath };
  };

  test("k3s and RKE2 nodes: their component points node-setup and its undo at the node's own containerd folder, mounted at the same path", () => {
    for (const flavour of FLAVOURS) {
      const dir = `/var/lib/rancher/${flavour}/agent/etc/containerd`;
      const expected = { config: `${dir}/config.toml`, mountPath: dir, hostPath: { path: dir, type: 'Directory' } };
      const peer = find(`default-lazy-${flavour}`, 'DaemonSet', 'starling-peer');
      assert.deepEqual(containerdFolder(peer, 'node-setup'), expected, `${flavour}: the peer's node-setup`);
      assert.ok(container(peer, 'node-setup').args.includes('--lazy'), `${flavour}: the lazy component's flags are kept`);
      const undo = find(`uninstall-${flavour}`, 'DaemonSet', 'starling-node-undo');
      assert.deepEqual(containerdFolder(undo, 'node-undo'), expected, `${flavour}: the uninstall's node-setup --undo`);
    }
    const plain = {
      config: '/etc/containerd/config.toml',
      mountPath: '/etc/containerd',
      hostPath: { path: '/etc/containerd', type: 'DirectoryOrCreate' },
    };
    assert.deepEqual(containerdFolder(find('default-lazy', 'DaemonSet', 'starling-peer'), 'node-setup'), plain);
    assert.deepEqual(containerdFolder(find('uninstall', 'DaemonSet', 'starling-node-undo'), 'node-undo'), plain);
  });

  test('the image is named in one place (components/image), and every container of every overlay and of the uninstall runs it', async () => {
    const named: string[] = [];
    for (const file of (await fsp.readdir(DEPLOY, { recursive: true })).filter((f) => f.endsWith('kustomization.yaml'))) {
      if (/^\s*newName:/m.test(await fsp.readFile(path.join(DEPLOY, file), 'utf8'))) named.push(file);
    }
    assert.deepEqual(named, [path.join('components', 'image', 'kustomization.yaml')]);
    const images = new Set<string>();
    for (const [overlay, objects] of Object.entries(rendered)) {
      for (const object of objects.filter((o) => o.spec?.template?.spec)) {
        for (const c of [...(podSpec(object).initContainers ?? []), ...podSpec(object).containers]) {
          if (object.metadata.name === 'starling-postgres') continue; // the trial's database
          images.add(c.image);
          assert.equal(c.image, 'registry.example.com/starling/starling:0.1.0', `${overlay} ${object.metadata.name} ${c.name}`);
        }
      }
    }
    assert.deepEqual([...images], ['registry.example.com/starling/starling:0.1.0']);
  });
});
