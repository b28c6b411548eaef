// Runs a workload over a stack of read-only layer directories, the way a container would see it,
// with nothing but util-linux and the shell:
//
//   unshare --mount --uts --ipc --pid --fork --kill-child [--net] --propagation private
//     /bin/sh -c SETUP …            (PID 1 of the new PID namespace, still the host's root)
//       mounts the overlay (lowerdirs + a fresh upper) on ROOT, then /proc, a minimal /dev
//       (null zero full random urandom tty, fd links, shm) and /tmp inside it, sets the hostname
//       and brings up lo when the network is private; then
//     exec env -i ENV… unshare --root=ROOT --wd=CWD [--setgid G --setuid U] -- ARGV…
//       (chroot, chdir, drop to the user, exec the workload with exactly ENV)
//
// Every mount is made inside the new mount namespace (propagation private): none is visible on
// the host and all of them disappear with the namespace. The workload runs as PID 1 of its PID
// namespace; ending it (SIGKILL from here) makes the kernel kill everything else in there, so one
// kill ends the sandbox, whatever the workload started.
import { spawn } from 'node:child_process';
import { accessSync, constants, readFileSync } from 'node:fs';
import path from 'node:path';
import { UserError } from '../common/errors.js';

export interface SandboxOptions {
  /** Layer directories, topmost first (overlayfs lowerdir order). */
  lowerDirs: string[];
  /** Empty directories on one file system that can hold an overlay upper layer. */
  upperDir: string;
  workDir: string;
  /** An empty directory: the overlay is mounted here, inside the sandbox's mount namespace only. */
  rootDir: string;
  argv: string[];
  /** KEY=VALUE: the workload's whole environment. */
  env: string[];
  cwd: string;
  uid: number;
  gid: number;
  /** 'private': a new network namespace with only lo (the default); 'host': the host's network. */
  network: 'private' | 'host';
  hostname?: string;
  /** The workload is killed after this long (when it has not exited by itself). */
  timeoutMs: number;
  /** Aborting kills the workload at once; run() then rejects with the signal's reason. */
  signal?: AbortSignal;
  /** The workload's stdout and stderr (default: this process's stderr). */
  output?: NodeJS.WritableStream;
  /** Called once the sandbox process has been started. */
  onSpawn?: (pid: number) => void;
}

export interface SandboxResult {
  /** The workload's exit code; null when it was killed. */
  exitCode: number | null;
  /** True when the period ran out and the workload was killed. */
  timedOut: boolean;
  seconds: number;
}

/** Exit code of the setup script when it fails (after a "starling-sandbox:" line on stderr). */
const SETUP_FAILED = 125;

const SETUP_SCRIPT = `
fail() { echo "starling-sandbox: $*" >&2; exit ${SETUP_FAILED}; }
stl_root=$1 stl_lowerbase=$2 stl_lower=$3 stl_upper=$4 stl_work=$5 stl_net=$6 stl_hostname=$7
shift 7
# Relative lowerdirs (from their common parent) keep the option under the kernel's one-page limit.
(cd "$stl_lowerbase" && mount -t overlay overlay -o "lowerdir=$stl_lower,upperdir=$stl_upper,workdir=$stl_work" "$stl_root") || fail "cannot mount the overlay rootfs"
for d in proc dev tmp; do
  [ -d "$stl_root/$d" ] || mkdir -p "$stl_root/$d" || fail "cannot create /$d in the rootfs"
done
mount -t proc -o nosuid,nodev,noexec proc "$stl_root/proc" || fail "cannot mount /proc"
mount -t tmpfs -o nosuid,noexec,mode=0755,size=1m tmpfs "$stl_root/dev" || fail "cannot mount /dev"
mknod -m 666 "$stl_root/dev/null" c 1 3 && mknod -m 666 "$stl_root/dev/zero" c 1 5 &&
  mknod -m 666 "$stl_root/dev/full" c 1 7 && mknod -m 666 "$stl_root/dev/random" c 1 8 &&
  mknod -m 666 "$stl_root/dev/urandom" c 1 9 && mknod -m 666 "$stl_root/dev/tty" c 5 0 || fail "cannot create devices in /dev"
ln -s /proc/self/fd "$stl_root/dev/fd" && ln -s /proc/self/fd/0 "$stl_root/dev/stdin" &&
  ln -s /proc/self/fd/1 "$stl_root/dev/stdout" && ln -s /proc/self/fd/2 "$stl_root/dev/stderr" || fail "cannot create links in /dev"
mkdir "$stl_root/dev/shm" && mount -t tmpfs -o nosuid,nodev,mode=1777 shm "$stl_root/dev/shm" || fail "cannot mount /dev/shm"
mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs "$stl_root/tmp" || fail "cannot mount /tmp"
if [ "$stl_net" = private ] && command -v ip >/dev/null; then ip link set lo up || fail "cannot bring up lo"; fi
hostname "$stl_hostname" || fail "cannot set the hostname"
exec env -i "$@"
`;

const HOST_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

let unshareBinary: string | undefined;

/** The absolute path of util-linux's unshare (the inner one runs under the workload's PATH). */
function findUnshare(): string {
  if (unshareBinary) return unshareBinary;
  for (const dir of `${process.env.PATH ?? ''}:${HOST_PATH}`.split(':').filter((d) => d.startsWith('/'))) {
    const candidate = path.join(dir, 'unshare');
    try {
      accessSync(candidate, constants.X_OK);
      return (unshareBinary = candidate);
    } catch {
      // not here
    }
  }
  throw new UserError("starling optimize needs util-linux's unshare (apt-get install util-linux)");
}

/** Overlayfs options are comma-separated and lowerdir is colon-separated: refuse paths holding them. */
function checkOverlayPath(dir: string): void {
  if (/[,:\\\s]/.test(dir))
    throw new UserError(`cannot use ${dir} in an overlay mount (it holds a comma, colon, backslash or space); choose another --tmp-dir`);
}

export async function runSandbox(options: SandboxOptions): Promise<SandboxResult> {
  options.signal?.throwIfAborted();
  for (const dir of [...options.lowerDirs, options.upperDir, options.workDir, options.rootDir]) checkOverlayPath(dir);
  if (options.lowerDirs.length === 0) throw new UserError('the image has no layers: there is nothing to run');
  const unshare = findUnshare();
  // One parent for all lowerdirs (mountLayers makes them so): name them relative to it.
  const lowerBase = path.dirname(options.lowerDirs[0] ?? '/');
  const lowerDirs = options.lowerDirs.every((d) => path.dirname(d) === lowerBase)
    ? options.lowerDirs.map((d) => path.basename(d))
    : options.lowerDirs;
  if (lowerDirs.join(':').length + options.upperDir.length + options.workDir.length > 3900) {
    throw new UserError(`the image has too many layers (${options.lowerDirs.length}) for one overlay mount`);
  }
  const outer = ['--mount', '--uts', '--ipc', '--pid', '--fork', '--kill-child', '--propagation', 'private'];
  if (options.network === 'private') outer.push('--net');
  const inner = [unshare, `--root=${options.rootDir}`, `--wd=${options.cwd}`];
  if (options.uid !== 0 || options.gid !== 0) inner.push('--setgid', String(options.gid), '--setuid', String(options.uid));
  const args = [
    ...outer,
    '--',
    '/bin/sh',
    '-c',
    SETUP_SCRIPT,
    'starling-sandbox',
    options.rootDir,
    lowerBase,
    lowerDirs.join(':'),
    options.upperDir,
    options.workDir,
    options.network,
    options.hostname ?? 'starling-optimize',
    ...options.env,
    ...inner,
    '--',
    ...options.argv,
  ];

  const output = options.output ?? process.stderr;
  const started = Date.now();
  // Its own process group: a Ctrl-C on the terminal reaches only us, and we end the sandbox.
  const child = spawn(unshare, args, { stdio: ['ignore', 'pipe', 'pipe'], detached: true, env: { PATH: HOST_PATH }, cwd: '/' });
  let stderrTail = '';
  child.stdout.on('data', (data: Buffer) => output.write(data));
  child.stderr.on('data', (data: Buffer) => {
    output.write(data);
    stderrTail = (stderrTail + data.toString('utf8')).slice(-16384);
  });
  const closed = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code, signal) => resolve({ code, signal }));
  });
  if (child.pid !== undefined) options.onSpawn?.(child.pid);

  let timedOut = false;
  let aborted = false;
  const kill = () => killSandbox(child.pid);
  const timer = setTimeout(() => {
    timedOut = true;
    kill();
  }, options.timeoutMs);
  const onAbort = () => {
    aborted = true;
    kill();
  };
  options.signal?.addEventListener('abort', onAbort, { once: true });
  // If the sandbox does not go within a few seconds of the kill, take unshare itself (its
  // --kill-child then kills the namespace's init).
  let escalate: NodeJS.Timeout | undefined;
  const watchdog = () => {
    escalate = setTimeout(() => child.pid !== undefined && signalPid(child.pid, 'SIGKILL'), 5000);
  };
  options.signal?.addEventListener('abort', watchdog, { once: true });
  const timeoutWatch = setTimeout(watchdog, options.timeoutMs);

  let result: { code: number | null; signal: NodeJS.Signals | null };
  try {
    result = await closed;
  } finally {
    clearTimeout(timer);
    clearTimeout(timeoutWatch);
    clearTimeout(escalate);
    options.signal?.removeEventListener('abort', onAbort);
    options.signal?.removeEventListener('abort', watchdog);
  }
  const seconds = (Date.now() - started) / 1000;
  if (aborted) throw options.signal?.reason;

  const setupError = /starling-sandbox: (.*)/.exec(stderrTail)?.[1];
  if (result.code === SETUP_FAILED && setupError) throw new Error(`sandbox setup failed: ${setupError}`);
  if (!timedOut) {
    const command = options.argv[0] ?? '';
    const execFailure = new RegExp(`unshare: failed to execute ${escapeRegExp(command)}: (.*)`).exec(stderrTail)?.[1];
    if ((result.code === 126 || result.code === 127) && execFailure) {
      throw new UserError(
        `the workload's command "${command}" cannot be run in the image: ${execFailure.trim()} (PATH ${pathOf(options.env)})`,
      );
    }
    const [, dir, reason] = /unshare: cannot chdir to '(.*)': (.*)/.exec(stderrTail) ?? [];
    if (result.code === 1 && reason !== undefined)
      throw new UserError(`the working directory ${dir} is not usable in the image: ${reason.trim()}`);
  }
  // unshare reports a killed child as its own exit code 128+n (or dies by the signal).
  return { exitCode: timedOut ? null : result.code, timedOut, seconds };
}

/** SIGKILL to the PID namespace's init (unshare's child): the kernel then kills the rest. */
function killSandbox(pid: number | undefined): void {
  if (pid === undefined) return;
  let children: number[] = [];
  try {
    children = readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number);
  } catch {
    // unshare already gone
  }
  if (children.length === 0) signalPid(pid, 'SIGKILL'); // not forked yet: --kill-child covers the child
  for (const child of children) signalPid(child, 'SIGKILL');
}

function signalPid(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch {
    // already gone
  }
}

function pathOf(env: string[]): string {
  return env.find((e) => e.startsWith('PATH='))?.slice(5) ?? '(unset)';
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}
