// `starling optimize`: record what a workload reads at start-up and convert the image with those
// files first in their layers (before the `.prefetch.landmark`), as `ctr-remote image optimize`.
//
//  1. The source image is converted, unoptimized, into an OCI layout in a temp dir (the ordinary
//     convert path: plain layers become eStargz, eStargz layers are kept as they are).
//  2. Each layer is mounted lazily (FUSE, mountLazyLayer) with an access hook; the mounts are
//     stacked with overlayfs (read-only lowerdirs + a temp upper) inside a sandbox: new mount,
//     PID, UTS, IPC and (by default) network namespaces and a chroot, with /proc, /dev and /tmp.
//  3. The workload runs until it exits or the period ends. Each regular file opened is recorded
//     once, in first-access order, under the index of the layer that served it: overlayfs opens
//     a lower file only in the topmost layer holding it.
//  4. The record is written in ctr-remote's format (--record-out) and the source image is
//     converted again, by digest, with the record (exactly what `convert --record-in` does).
import { mkdtemp, mkdir, realpath, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { UserError } from '../common/errors.js';
import { convertImage, resolveImageManifest, type ConvertOptions, type ConvertResult } from '../convert/convert.js';
import { readSmallBlob } from '../convert/blob-io.js';
import { LayoutStore } from '../convert/layout-store.js';
import { parseConfig, parseImageManifest } from '../convert/manifest.js';
import type { ImageStore } from '../convert/store.js';
import { mountsBelow, unmountBelowSync } from './mounts.js';
import { mountLayers, readMergedFile, type MountedLayers } from './layers.js';
import { AccessRecorder, type RecordedFile } from './recorder.js';
import { runSandbox, type SandboxResult } from './sandbox.js';
import { buildWorkload, resolveUser, type Workload, type WorkloadOverrides } from './workload.js';

export interface OptimizeOptions {
  workload: WorkloadOverrides;
  /** How long the workload may run before it is killed (default 10 s, as ctr-remote). */
  periodMs?: number;
  /** 'private' (default): the sandbox has its own network namespace with only lo; 'host': the host's network. */
  network?: 'private' | 'host';
  /** Where to write the record (ctr-remote's --record-out format). */
  recordOut?: string;
  /** How both conversions are made (compression, level, chunk size, workers, platform). */
  convert: Omit<ConvertOptions, 'prioritizedFiles' | 'recording' | 'allPlatforms' | 'tmpDir'>;
  /** Parent of the temp work dir (default: the OS temp dir). */
  tmpDir?: string;
  /** Aborting (Ctrl-C) kills the workload, unmounts everything and rejects with the reason. */
  signal?: AbortSignal;
  /** Status lines (default: stderr). */
  log?: (line: string) => void;
  /** Where the workload's stdout and stderr go (default: stderr). */
  output?: NodeJS.WritableStream;
}

export interface OptimizeResult extends ConvertResult {
  /** The source image manifest the record refers to (the platform's manifest for an index). */
  sourceManifest: string;
  files: readonly RecordedFile[];
  workload: Workload & SandboxResult;
}

export const DEFAULT_PERIOD_MS = 10_000;

export async function optimizeImage(
  src: ImageStore,
  srcReference: string,
  dst: ImageStore,
  dstTag: string,
  options: OptimizeOptions,
): Promise<OptimizeResult> {
  const log = options.log ?? ((line: string) => process.stderr.write(`${line}\n`));
  const signal = options.signal;
  if (typeof process.getuid === 'function' && process.getuid() !== 0) {
    throw new UserError('starling optimize must run as root: it mounts FUSE and overlay file systems and creates namespaces');
  }
  const parent = await realpath(options.tmpDir ?? tmpdir()).catch((error: Error) => {
    throw new UserError(`--tmp-dir: ${error.message}`);
  });
  const work = await mkdtemp(path.join(parent, 'starling-opt-'));
  // A second Ctrl-C, or an exit while something is mounted: detach what is left, synchronously.
  const onExit = () => unmountBelowSync(work);
  process.once('exit', onExit);
  let mounted: MountedLayers | undefined;
  try {
    signal?.throwIfAborted();
    const manifest = await abortable(resolveImageManifest(src, srcReference, options.convert.platform), signal);
    log(`optimize: ${src.name}@${manifest.digest}: converting for the recording run (no prioritized files)`);
    const layout = new LayoutStore(path.join(work, 'oci'));
    // Only mounted here, never shipped: the fastest compression level will do. Layers already
    // in the wanted format are kept as they are.
    const converted = await abortable(
      convertImage(src, manifest.digest, layout, 'work', { ...options.convert, level: 1, tmpDir: work }),
      signal,
    );
    const convertedManifest = parseImageManifest(await layout.getManifest(converted.digest), layout.name);
    const config = parseConfig(
      await readSmallBlob(layout, convertedManifest.config, 'config'),
      layout.name,
      convertedManifest.config.digest,
    );
    const workload = buildWorkload(config, options.workload);

    const recorder = new AccessRecorder();
    const layersDir = path.join(work, 'layers');
    await mkdir(layersDir);
    mounted = await mountLayers(convertedManifest.layers, {
      blobPath: (digest) => path.join(work, 'oci', 'blobs', 'sha256', digest.slice('sha256:'.length)),
      dir: layersDir,
      onAccess: (i) => recorder.hook(i),
      onWarning: (message) => log(`optimize: warning: ${message}`),
    });
    const readers = mounted.readers;
    const user = await resolveUser(workload.user, async (name) => (await readMergedFile(readers, name))?.toString('utf8'));
    for (const dir of ['upper', 'work', 'root']) await mkdir(path.join(work, dir));

    const periodMs = options.periodMs ?? DEFAULT_PERIOD_MS;
    log(
      `optimize: running ${JSON.stringify(workload.argv)} for at most ${periodMs / 1000} s (user ${user.uid}:${user.gid}, cwd ${workload.cwd})`,
    );
    recorder.start();
    let ran: SandboxResult;
    try {
      ran = await runSandbox({
        lowerDirs: [...mounted.dirs].reverse(),
        upperDir: path.join(work, 'upper'),
        workDir: path.join(work, 'work'),
        rootDir: path.join(work, 'root'),
        argv: workload.argv,
        env: workload.env,
        cwd: workload.cwd,
        uid: user.uid,
        gid: user.gid,
        network: options.network ?? 'private',
        timeoutMs: periodMs,
        signal,
        output: options.output,
      });
    } finally {
      recorder.stop();
    }
    log(
      ran.timedOut
        ? `optimize: the workload was stopped after ${periodMs / 1000} s`
        : `optimize: the workload exited with code ${ran.exitCode} after ${ran.seconds.toFixed(1)} s`,
    );
    await mounted.unmountAll();
    mounted = undefined;

    const files = recorder.files;
    log(`optimize: ${files.length} file(s) read, in ${new Set(files.map((f) => f.layerIndex)).size} layer(s)`);
    if (files.length === 0) log('optimize: warning: the workload read no file from the image: nothing will be prefetched');
    if (options.recordOut) await recorder.write(options.recordOut, manifest.digest);

    signal?.throwIfAborted();
    log(`optimize: converting ${src.name}@${manifest.digest} with the recorded files first`);
    const result = await abortable(
      convertImage(src, manifest.digest, dst, dstTag, {
        ...options.convert,
        recording: recorder.toRecording(manifest.digest),
        tmpDir: work,
      }),
      signal,
    );
    return { ...result, sourceManifest: manifest.digest, files, workload: { ...workload, ...ran } };
  } finally {
    await mounted?.unmountAll();
    // rm must never walk into a live mount: detach whatever is still there first.
    if (mountsBelow(work).length > 0) unmountBelowSync(work);
    await rm(work, { recursive: true, force: true }).catch((error: Error) =>
      log(`optimize: warning: cannot remove ${work}: ${error.message}`),
    );
    process.removeListener('exit', onExit);
  }
}

/** Rejects as soon as `signal` aborts (the work itself goes on until the process exits). */
function abortable<T>(work: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return work;
  signal.throwIfAborted();
  work.catch(() => {}); // an abandoned conversion must not become an unhandled rejection
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    work.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}
