/* The `starling estargz` commands, run from the built dist/ as a user would. */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { test } from 'node:test';
import { promisify } from 'node:util';
import { everyTypeEntries, withTempDir } from './helpers.js';
import { makeTar } from '../fixtures/tar.js';
import { itemAt } from '../../src/common/indexing.js';

const CLI = resolve(import.meta.dirname, '../../dist/cli/main.js');
const run = promisify(execFile);
const starling = (...args: string[]) => run(process.execPath, [CLI, 'estargz', ...args], { encoding: 'buffer', maxBuffer: 64 << 20 });

test('estargz build, verify, ls and cat', { skip: existsSync(CLI) ? false : 'dist/ not built: run npx tsc -p .' }, async () => {
  await withTempDir(async (dir) => {
    const tar = await makeTar(everyTypeEntries(64 * 1024));
    await writeFile(join(dir, 'in.tar'), tar);
    await writeFile(join(dir, 'prio.txt'), 'd/big.bin\n\n');
    const blob = join(dir, 'out.esgz');
    const built = JSON.parse(
      (
        await starling(
          'build',
          join(dir, 'in.tar'),
          blob,
          '--chunk-size',
          '65536',
          '--level',
          '1',
          '--prioritized-files',
          join(dir, 'prio.txt'),
        )
      ).stdout.toString(),
    );
    assert.match(built.tocDigest, /^sha256:[0-9a-f]{64}$/);
    assert.equal(built.size, (await readFile(blob)).length);

    const verified = JSON.parse((await starling('verify', blob, '--toc-digest', built.tocDigest)).stdout.toString());
    assert.equal(verified.diffID, built.diffID);

    const listing = (await starling('ls', blob)).stdout.toString().trim().split('\n');
    assert.match(itemAt(listing, 0), /^dir\s+0755 .* d$/);
    assert.match(itemAt(listing, 2), /^reg .* \.prefetch\.landmark$/);
    assert.ok(listing.some((line) => /^symlink .* d\/link -> small\.txt$/.test(line)));

    const cat = (await starling('cat', blob, '/d/small.txt')).stdout;
    assert.equal(cat.toString(), 'hello estargz\n');

    await assert.rejects(
      starling('verify', blob, '--toc-digest', `sha256:${'0'.repeat(64)}`),
      (e: { code: number; stderr: Buffer }) => e.code === 2 && /TOC digest mismatch/.test(e.stderr.toString()),
    );
    await assert.rejects(starling('cat', blob, 'nope'), (e: { stderr: Buffer }) => /"nope" is not in the layer/.test(e.stderr.toString()));
    const zstd = JSON.parse(
      (await starling('build', join(dir, 'in.tar'), join(dir, 'z'), '--zstd', '--chunk-size', '65536')).stdout.toString(),
    );
    assert.match(zstd.zstdManifest.position, /^\d+:\d+:\d+:1$/);
    const zstdVerified = JSON.parse((await starling('verify', join(dir, 'z'), '--toc-digest', zstd.tocDigest)).stdout.toString());
    assert.equal(zstdVerified.diffID, zstd.diffID);
    assert.equal((await starling('cat', join(dir, 'z'), 'd/small.txt')).stdout.toString(), 'hello estargz\n');
    await assert.rejects(starling('build', join(dir, 'in.tar'), join(dir, 'z2'), '--zstd', '--level', '20'), (e: { stderr: Buffer }) =>
      /--level must be an integer from 1 to 19/.test(e.stderr.toString()),
    );
    await assert.rejects(starling('build', join(dir, 'in.tar'), join(dir, 'y'), '--level', '12'), (e: { stderr: Buffer }) =>
      /--level must be an integer from 0 to 9/.test(e.stderr.toString()),
    );
    await assert.rejects(starling('build', join(dir, 'prio.txt'), join(dir, 'w')), (e: { stderr: Buffer }) =>
      /tar/.test(e.stderr.toString()),
    );
    assert.equal(existsSync(join(dir, 'w')), false, 'a failed build leaves no output file');
  });
});
