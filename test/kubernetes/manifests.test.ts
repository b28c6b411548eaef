// deploy/kubernetes renders with kubectl's kustomize (as `kubectl apply -k` would), every object
// validates against the Kubernetes OpenAPI schema (kubernetes-models) and a strict pass that
// fails on misspelt fields, and the objects say what the design asks of them.
import assert from 'node:assert/strict';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { parseAllDocuments } from 'yaml';
import { makeTempDir, run, type TempDir } from '../fixtures/processes.js';
import { schemaErrors, unknownFieldErrors, type KubeObject } from './manifest-check.js';

const DEPLOY = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../deploy/kubernetes');

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
    for (const file of ['base/secrets/cluster-token', 'base/secrets/admin-token', 'overlays/ha/secrets/postgres-url', 'overlays/ha-trial/secrets/postgres-password']) {
      await fsp.writeFile(path.join(tmp.path, file), 'generated-by-the-test');
    }
    // The lazy component on top of each overlay, as the README says to add it.
    for (const overlay of ['default', 'ha']) {
      const dir = path.join(tmp.path, 'overlays', `${overlay}-lazy`);
      await fsp.mkdir(dir);
      await fsp.writeFile(
        path.join(dir, 'kustomization.yaml'),
        `apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../${overlay}\ncomponents:\n  - ../../components/lazy\n`,
      );
    }
    for (const overlay of ['default', 'ha', 'ha-trial', 'default-lazy', 'ha-lazy']) rendered[overlay] = await render(`overlays/${overlay}`);
    rendered.uninstall = await render('uninstall');
  });

  after(async () => {
    await tmp?.remove();
  });

  const all = () => Object.values(rendered).flat();
  const find = (overlay: string, kind: string, name: string): Obj => {
    const object = rendered[overlay]!.find((o) => o.kind === kind && o.metadata.name === name);
    assert.ok(object, `${overlay}: ${kind}/${name}`);
    return object;
  };
  const podSpec = (object: Obj) => object.spec.template.spec;
  const container = (object: Obj, name: string) => [...(podSpec(object).initContainers ?? []), ...podSpec(object).containers].find((c: any) => c.name === name);

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
    for (const probe of [main.readinessProbe, main.livenessProbe]) assert.deepEqual(probe.httpGet, { host: '127.0.0.1', path: '/healthz', port: 65001 });
    for (const c of [...spec.initContainers, ...spec.containers]) assert.ok(c.resources?.requests && c.resources?.limits?.memory, `${c.name} has resources`);
    const token = spec.volumes.find((v: any) => v.name === 'cluster-token');
    assert.match(token.secret.secretName, /^starling-cluster-token-[a-z0-9]{10}$/, 'a generated Secret (name with its content hash)');
    assert.deepEqual(container(peer, 'node-setup').args.slice(0, 2), ['node-setup', '--containerd-config=/etc/containerd/config.toml']);
    assert.ok(container(peer, 'node-labels').args.includes('--rack-label=$(RACK_LABEL)'));
    assert.ok(main.args.includes('--labels-file=/etc/starling/node/labels.yaml'));
  });

  test('Secrets are generated, never written in a manifest', async () => {
    // The tokens carry their content's hash, so pods roll when one changes; the database Secrets keep
    // a fixed name (kustomize does not rename references that a patch adds).
    const names = all().filter((o) => o.kind === 'Secret').map((o) => o.metadata.name.replace(/-[a-z0-9]{10}$/, '-<hash>'));
    assert.deepEqual([...new Set(names)].sort(), ['starling-admin-token-<hash>', 'starling-cluster-token-<hash>', 'starling-manager-db', 'starling-postgres']);
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
      assert.equal(rendered[overlay]!.some((o) => o.kind === 'PersistentVolumeClaim'), false, `${overlay}: no SQLite volume`);
      assert.equal(find(overlay, 'StatefulSet', 'starling-scheduler').spec.replicas, 3);
      assert.equal(find(overlay, 'StatefulSet', 'starling-seed').spec.replicas, 2);
      const three = '--scheduler=starling-scheduler-0.starling-scheduler:8002,starling-scheduler-1.starling-scheduler:8002,starling-scheduler-2.starling-scheduler:8002';
      assert.ok(container(find(overlay, 'DaemonSet', 'starling-peer'), 'peer').args.includes(three));
      assert.ok(container(find(overlay, 'StatefulSet', 'starling-seed'), 'seed').args.includes(three));
    }
    const external = container(find('ha', 'Deployment', 'starling-manager'), 'manager').env;
    assert.equal(external[0].valueFrom.secretKeyRef.name, 'starling-manager-db');
    const trial = container(find('ha-trial', 'Deployment', 'starling-manager'), 'manager').env;
    assert.deepEqual(trial.map((e: any) => e.name), ['PGPASSWORD', 'STARLING_MANAGER_DB'], 'the password is defined before the URL that uses it');
    assert.equal(trial[0].valueFrom.secretKeyRef.name, 'starling-postgres');
    assert.ok(rendered['ha-trial']!.some((o) => o.kind === 'Secret' && o.metadata.name === 'starling-postgres'));
    find('ha-trial', 'StatefulSet', 'starling-postgres');
  });

  test('lazy: the snapshotter DaemonSet (privileged, /dev/fuse, bidirectional propagation, its FUSE server in its own container) and node-setup --lazy', () => {
    for (const overlay of ['default-lazy', 'ha-lazy']) {
      const snapshotter = find(overlay, 'DaemonSet', 'starling-snapshotter');
      const spec = podSpec(snapshotter);
      assert.deepEqual(spec.containers.map((c: any) => c.name), ['fuse-server', 'snapshotter']);
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
    assert.equal(rendered.default!.some((o) => o.metadata.name === 'starling-snapshotter'), false);
  });

  test('uninstall runs node-setup --undo on every node', () => {
    const undo = find('uninstall', 'DaemonSet', 'starling-node-undo');
    assert.deepEqual(container(undo, 'node-undo').args, ['node-setup', '--undo', '--containerd-config=/etc/containerd/config.toml']);
    assert.deepEqual(podSpec(undo).tolerations, [{ operator: 'Exists' }]);
  });
});
