// npm's install step: builds the N-API addons in native/ with the node-gyp that npm carries.
// None of them may stop an install, because no command needs all of them: the mirror, the
// scheduler and the manager run without any (digest and sendfile only make the peer faster, and
// the code falls back to node:crypto and copies), and only lazy pulling needs FUSE. So an addon
// whose system headers are missing is skipped with one line saying what it costs and how to get
// it, and one that fails to compile is reported with the compiler's last lines; the install goes
// on either way. `npm run build:<addon>` builds one strictly, with node-gyp's full output.
import { spawn } from 'node:child_process';

/** What a machine lacks without each addon, and what it needs beyond a C++ compiler. */
const ADDONS = [
  { name: 'digest', without: 'digests run on the JavaScript thread (slower pulls)' },
  { name: 'sendfile', without: 'cached blobs are copied through JavaScript instead of sent with sendfile(2)' },
  {
    name: 'fuse',
    without: 'no lazy pulling (starling snapshotter, fuse-server, optimize)',
    // binding.gyp asks pkg-config for libfuse3's flags.
    prerequisite: {
      command: ['pkg-config', '--exists', 'fuse3'],
      missing: (code) => (code === 127 ? 'pkg-config is not installed' : 'libfuse3-dev is not installed'),
      install: 'apt-get install fuse3 libfuse3-dev pkg-config',
    },
  },
];

/** node-gyp's progress and the parts of its error report that are the same for every failure. */
const NODE_GYP_NOISE =
  /^(gyp (info|ERR! (stack +at |System |command |cwd |node -v |node-gyp -v |not ok|\$npm_))|make(\[\d+\])?: (Entering|Leaving) directory)/;

/** Runs a command to its end; resolves with its exit code (127 when it cannot start) and output. */
function run(command, args) {
  return new Promise((resolve) => {
    const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    const output = [];
    child.stdout.on('data', (chunk) => output.push(chunk));
    child.stderr.on('data', (chunk) => output.push(chunk));
    child.once('error', (error) => resolve({ code: 127, output: error.message }));
    child.once('close', (code) => resolve({ code: code ?? 1, output: Buffer.concat(output).toString('utf8') }));
  });
}

/** 'built', or the lines that say why not. */
async function build(addon) {
  const { prerequisite } = addon;
  const check = prerequisite && (await run(prerequisite.command[0], prerequisite.command.slice(1)));
  if (check && check.code !== 0) {
    return [
      `starling: native/${addon.name} skipped: ${prerequisite.missing(check.code)}; without it ${addon.without}. To add it: ${prerequisite.install}, then npm run build:${addon.name}`,
    ];
  }
  // node-gyp is on PATH in npm's scripts (npm's own copy, which npm's config points at the installed Node's headers).
  const { code, output } = await run('node-gyp', ['rebuild', '--directory', `native/${addon.name}`]);
  if (code === 0) return 'built';
  const tail = output
    .trimEnd()
    .split('\n')
    .filter((line) => !NODE_GYP_NOISE.test(line))
    .slice(-12);
  return [
    `starling: native/${addon.name} failed to build; without it ${addon.without}. node-gyp said:`,
    ...tail.map((line) => `  ${line}`),
    `  (npm run build:${addon.name} builds it again with the full output)`,
  ];
}

// One at a time: all three take ~6 s here, and building them at once saved nothing measurable.
const built = [];
for (const addon of ADDONS) {
  const result = await build(addon);
  if (result === 'built') built.push(addon.name);
  else console.warn(result.join('\n'));
}
if (built.length > 0) console.log(`starling: native addons built: ${built.join(', ')}`);
