// npm's install step for the native addons (scripts/build-addons.mjs), run by npm as `npm ci` runs
// it, on a copy of native/ where one addon does not compile and libfuse3 cannot be found: the
// install goes on, and each addon it could not build gets a short, plain report.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { makeTempDir, run, type RunResult, type TempDir } from '../fixtures/processes.js';

const REPO_ROOT = path.resolve(import.meta.dirname, '../..');

describe('the install step that builds the native addons', { timeout: 300_000 }, () => {
  let work: TempDir;
  let result: RunResult;

  before(async () => {
    work = await makeTempDir('starling-build-addons-');
    const project = work.path;
    await fsp.mkdir(path.join(project, 'scripts'));
    await fsp.copyFile(path.join(REPO_ROOT, 'scripts/build-addons.mjs'), path.join(project, 'scripts/build-addons.mjs'));
    for (const addon of ['digest', 'sendfile', 'fuse']) {
      await fsp.cp(path.join(REPO_ROOT, 'native', addon), path.join(project, 'native', addon), {
        recursive: true,
        filter: (source) => path.basename(source) !== 'build',
      });
    }
    await fsp.appendFile(path.join(project, 'native/digest/src/digest.cc'), '\n#error deliberately broken by the test\n');
    await fsp.mkdir(path.join(project, 'node_modules'));
    await fsp.symlink(path.join(REPO_ROOT, 'node_modules/node-addon-api'), path.join(project, 'node_modules/node-addon-api'));
    await fsp.writeFile(
      path.join(project, 'package.json'),
      JSON.stringify({ name: 'addons-under-test', private: true, scripts: { install: 'node scripts/build-addons.mjs' } }),
    );
    // pkg-config then finds no fuse3, as on a machine without libfuse3-dev.
    await fsp.mkdir(path.join(project, 'no-pkgconfig'));
    result = await run('npm', ['run', 'install'], {
      cwd: project,
      env: { PKG_CONFIG_LIBDIR: path.join(project, 'no-pkgconfig'), PKG_CONFIG_PATH: '' },
      timeoutMs: 240_000,
    });
  });
  after(async () => {
    await work?.remove();
  });

  it('builds what it can and does not fail the install for what it cannot', () => {
    assert.equal(result.code, 0, `${result.stdout}\n${result.stderr}`);
    assert.ok(fs.existsSync(path.join(work.path, 'native/sendfile/build/Release/starling_sendfile.node')));
    assert.ok(!fs.existsSync(path.join(work.path, 'native/digest/build/Release/starling_digest.node')));
    assert.match(result.stdout, /^starling: native addons built: sendfile$/m);
  });

  it('says in one line that FUSE was skipped, what that costs and how to add it', () => {
    const lines = result.stderr.split('\n').filter((line) => line.includes('native/fuse'));
    assert.deepEqual(lines, [
      'starling: native/fuse skipped: libfuse3-dev is not installed; without it no lazy pulling (starling snapshotter, fuse-server, optimize). ' +
        'To add it: apt-get install fuse3 libfuse3-dev pkg-config, then npm run build:fuse',
    ]);
  });

  it("reports a failed build with the compiler's error and how to retry, without node-gyp's chatter", () => {
    assert.match(
      result.stderr,
      /^starling: native\/digest failed to build; without it digests run on the JavaScript thread \(slower pulls\)\. node-gyp said:$/m,
    );
    assert.match(result.stderr, /#error deliberately broken by the test/);
    assert.match(result.stderr, /^ {2}\(npm run build:digest builds it again with the full output\)$/m);
    assert.doesNotMatch(result.stdout + result.stderr, /gyp info|gyp ERR! stack +at |Entering directory/);
    const report = result.stderr.split('\n').filter((line) => line.startsWith('  '));
    assert.ok(report.length <= 13, `at most 12 lines of node-gyp's output and the retry hint:\n${result.stderr}`);
  });
});
