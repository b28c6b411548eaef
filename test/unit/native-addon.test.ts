import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { UserError } from '../../src/common/errors.js';
import { addonPath, optionalAddon, requiredAddon } from '../../src/common/native-addon.js';

describe('loading the native addons', () => {
  it('names a missing addon, where it was looked for and how to get it', () => {
    const name = `missing-${process.pid}`;
    assert.equal(optionalAddon(name, 'x'), null);
    assert.throws(
      () => requiredAddon(name, 'x', 'run `npm run build:x`'),
      (error: unknown) =>
        error instanceof UserError &&
        error.message === `the ${name} addon (native/${name}) is not built (no ${addonPath(name, 'x')}); run \`npm run build:x\``,
    );
  });

  it('tells an addon that is built but cannot be loaded here from one never built, quoting the loader', (t) => {
    const name = `broken-${process.pid}`;
    const file = addonPath(name, 'broken');
    const folder = path.resolve(path.dirname(file), '../../');
    t.after(() => fs.rmSync(folder, { recursive: true, force: true }));
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.writeFileSync(file, Buffer.alloc(4096, 'not an ELF file '));
    assert.throws(
      () => requiredAddon(name, 'broken', 'install it'),
      (error: unknown) =>
        error instanceof UserError &&
        error.message.startsWith(`the ${name} addon (native/${name}) cannot be loaded (`) &&
        error.message.includes('invalid ELF header') &&
        error.message.endsWith('); install it'),
    );
  });
});
