import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  cidrContains,
  clusterScopesSchema,
  globMatches,
  matchCluster,
  parseCidr,
  type ScopedCluster,
} from '../../src/manager/services/scopes.js';

const scopes = (s: Partial<{ zones: string[]; cidrs: string[]; hostnames: string[] }>) => clusterScopesSchema.parse(s);

describe('scheduler-cluster scopes', () => {
  test('hostname globs: * and ? only, whole name, case-insensitive, dots literal', () => {
    assert.ok(globMatches('gpu-*', 'gpu-17'));
    assert.ok(globMatches('gpu-?', 'GPU-1'));
    assert.ok(!globMatches('gpu-?', 'gpu-12'));
    assert.ok(!globMatches('gpu-*', 'xgpu-1'));
    assert.ok(!globMatches('a.b', 'axb'));
  });

  test('CIDRs, IPv4 and IPv6; malformed ones are refused with the list index', () => {
    assert.deepEqual(parseCidr('10.1.0.0/16'), { address: '10.1.0.0', prefix: 16, family: 'ipv4' });
    assert.equal(parseCidr('10.1.0.0/33'), undefined);
    assert.equal(parseCidr('10.1.0.0'), undefined);
    const [v4, v6] = [parseCidr('10.1.0.0/16'), parseCidr('fd00::/8')];
    assert.ok(v4 && v6, 'both CIDRs parse');
    assert.ok(cidrContains(v4, '10.1.200.3'));
    assert.ok(!cidrContains(v4, '10.2.0.1'));
    assert.ok(cidrContains(v6, 'fd12::1'));
    assert.ok(!cidrContains(v6, '10.1.0.1'));
    const bad = clusterScopesSchema.safeParse({ cidrs: ['10.0.0.0/8', 'nope'] });
    assert.equal(bad.success, false);
    assert.deepEqual(bad.error.issues[0]?.path, ['cidrs', 1]);
  });

  test('most specific wins: hostname over CIDR over zone; longer prefix, more literal glob; else the default', () => {
    const clusters: ScopedCluster[] = [
      { id: 1, isDefault: true, scopes: scopes({}) },
      { id: 2, isDefault: false, scopes: scopes({ zones: ['z1'] }) },
      { id: 3, isDefault: false, scopes: scopes({ cidrs: ['10.1.0.0/16'] }) },
      { id: 4, isDefault: false, scopes: scopes({ cidrs: ['10.1.2.0/24'] }) },
      { id: 5, isDefault: false, scopes: scopes({ hostnames: ['gpu-*'] }) },
      { id: 6, isDefault: false, scopes: scopes({ hostnames: ['gpu-rack7-*'] }) },
    ];
    const place = (ip: string, hostname: string, zone?: string) => ({
      ip,
      hostname,
      labels: zone ? { zone } : ({} as Record<string, string>),
    });
    assert.equal(matchCluster(clusters, place('192.168.0.1', 'web-1')), 1);
    assert.equal(matchCluster(clusters, place('192.168.0.1', 'web-1', 'z1')), 2);
    assert.equal(matchCluster(clusters, place('10.1.9.9', 'web-1', 'z1')), 3);
    assert.equal(matchCluster(clusters, place('10.1.2.9', 'web-1', 'z1')), 4);
    assert.equal(matchCluster(clusters, place('10.1.2.9', 'gpu-3', 'z1')), 5);
    assert.equal(matchCluster(clusters, place('10.1.2.9', 'gpu-rack7-3', 'z1')), 6);
  });

  test('equal matches go to the lower id, whatever the order given', () => {
    const clusters: ScopedCluster[] = [
      { id: 9, isDefault: false, scopes: scopes({ zones: ['z'] }) },
      { id: 4, isDefault: false, scopes: scopes({ zones: ['z'] }) },
      { id: 1, isDefault: true, scopes: scopes({}) },
    ];
    assert.equal(matchCluster(clusters, { ip: '127.0.0.1', hostname: 'h', labels: { zone: 'z' } }), 4);
  });
});
