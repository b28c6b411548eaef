import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import pino from 'pino';
import { ClusterToken } from '../../src/common/token.js';

const OLD = 'old-cluster-token-0123456789';
const NEW = 'new-cluster-token-9876543210';

/** A logger whose records the test can read. */
function recordingLogger() {
  const records: Array<{ level: number; msg: string; err?: string }> = [];
  const logger = pino({ level: 'info' }, { write: (line: string) => records.push(JSON.parse(line) as (typeof records)[number]) });
  return { logger, records };
}

describe('the cluster token file', () => {
  const dir = mkdtempSync(join(tmpdir(), 'starling-token-'));
  after(() => rmSync(dir, { recursive: true, force: true }));
  let files = 0;
  const file = (text: string) => {
    const path = join(dir, `token-${files++}`);
    writeFileSync(path, text);
    return path;
  };

  it('sends the token of a one-line file and accepts only it', () => {
    const token = ClusterToken.fromFile(file(`${OLD}\n`));
    assert.equal(token.current, OLD);
    assert.equal(token.authorization, `Bearer ${OLD}`);
    assert.equal(token.accepts(`Bearer ${OLD}`), true);
    assert.equal(token.accepts(`Bearer ${NEW}`), false);
    assert.equal(token.accepts(OLD), false, 'the scheme is part of the header');
    assert.equal(token.accepts(undefined), false);
  });

  it('sends the first line of several and accepts every line (blank lines and spaces around ignored)', () => {
    const token = ClusterToken.fromFile(file(`  ${NEW}  \n\n${OLD}\n`));
    assert.equal(token.current, NEW);
    assert.equal(token.accepts(`Bearer ${NEW}`), true);
    assert.equal(token.accepts(`Bearer ${OLD}`), true);
    assert.equal(token.accepts(`Bearer ${OLD}x`), false);
  });

  it('refuses an unreadable or empty file, a short token and one with spaces, naming the file and line', () => {
    assert.throws(() => ClusterToken.fromFile(join(dir, 'missing')), /cannot read cluster token file .*missing/);
    assert.throws(() => ClusterToken.fromFile(file('\n \n')), /cluster token file .* is empty/);
    assert.throws(() => ClusterToken.fromFile(file(`${OLD}\nshort\n`)), /line 2 of cluster token file .* shorter than 16 characters/);
    assert.throws(() => ClusterToken.fromFile(file(`${OLD} ${NEW}\n`)), /line 1 of cluster token file .* contains whitespace/);
  });

  it('takes a new version of the file on reload, and keeps the tokens in use when the new one cannot be used', () => {
    const path = file(`${OLD}\n`);
    const token = ClusterToken.fromFile(path);
    const { logger, records } = recordingLogger();
    writeFileSync(path, `${OLD}\n${NEW}\n`);
    token.reload(logger);
    assert.equal(token.current, OLD);
    assert.equal(token.accepts(`Bearer ${NEW}`), true);
    assert.ok(records.some((r) => r.msg === 'cluster token file reloaded'));

    writeFileSync(path, 'too-short\n');
    token.reload(logger);
    assert.equal(token.current, OLD, 'a bad edit changes nothing');
    assert.equal(token.accepts(`Bearer ${NEW}`), true);
    const refusal = records.find((r) => r.level === 50);
    assert.match(refusal?.err ?? '', /shorter than 16 characters/);

    rmSync(path);
    token.reload(logger);
    assert.equal(token.current, OLD, 'nor does a file removed for a moment (a Secret being swapped)');
  });
});
