// The images of the end-to-end cluster runs (bench/e2e-cluster.ts, test/e2e/): a multi-layer image
// whose workload prints a ready line, as a plain gzip image (rows a and b) and as eStargz converted
// by `starling optimize` with the workload's reads recorded (rows c and d). Built once and cached in
// /var/tmp under a name derived from everything that goes into them.
//
// Two of them:
//  - `debianModelImage`: Debian bookworm minbase, python3 on top (the layer `apt-get install
//    python3` would make), a model of random shards, and an app layer whose `serve.py` imports
//    modules, loads the index and the first shards, and prints `ready <sha256 of what it loaded>`;
//  - `busyboxModelImage`: the same shape at test size — busybox, shards, a shell script.
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { openEstargz, fileSource, TOC_DIGEST_ANNOTATION } from '../../src/estargz/index.js';
import { prefetchLength } from '../../src/lazy/index.js';
import { debianRootfs } from '../../test/fixtures/debian-rootfs.js';
import { buildImage, type BuildOptions, type LayerSpec } from '../../test/fixtures/images.js';
import { run } from '../../test/fixtures/processes.js';
import { layoutLayers } from './debian-image.js';

const CLI = path.resolve(import.meta.dirname, '../../dist/cli/main.js');
/** Bumped when what this file builds changes in a way the spec does not show. */
const FORMAT = 1;

export interface ImageLayer {
  digest: string;
  size: number;
  tocDigest?: string;
}

export interface LazyLayer extends ImageLayer {
  /** Bytes a lazy start must fetch from this layer: the prefetch range ([0, landmark)), then the TOC and the footer. */
  neededBytes: number;
}

export interface WorkloadImage {
  /** What the cache entry is called (and where it lives). */
  name: string;
  dir: string;
  /** The plain gzip image: OCI layout and tag. */
  plain: { layout: string; tag: string; layers: ImageLayer[]; bytes: number };
  /** `starling optimize` of it: eStargz with the workload's files first in their layers. */
  lazy: { layout: string; tag: string; layers: LazyLayer[]; bytes: number; neededBytes: number };
  /** Regular files the workload opened while it was recorded. */
  recordedFiles: number;
  /** The line the workload printed when it ran under `starling optimize`: every node must print the same. */
  readyLine: string;
}

export interface ModelImageOptions {
  /** Total size of the model's shards. */
  modelBytes: number;
  /** Size of one shard (the model is cut into modelBytes / shardBytes files). */
  shardBytes: number;
  /** Shards the workload loads at start-up (the first ones). */
  shardsLoaded: number;
}

/**
 * The realistic image: Debian base, python3, model, app (four layers). The base and python3 root
 * file systems come from debootstrap (cached in /var/tmp by test/fixtures/debian-rootfs.ts).
 */
export async function debianModelImage(options: ModelImageOptions): Promise<WorkloadImage> {
  const base = await rootfsOrThrow([]);
  const withPython = await rootfsOrThrow(['python3']);
  const serve = [
    '# The workload: import what a small inference server imports, load the first shards, say ready.',
    'import json, sqlite3, hashlib, decimal, http.client, email.parser, logging',
    "index = json.load(open('/models/index.json'))",
    'digest = hashlib.sha256()',
    "for name in index['loadAtStart']:",
    "    with open('/models/' + name, 'rb') as shard:",
    '        while True:',
    '            block = shard.read(1 << 20)',
    '            if not block:',
    '                break',
    '            digest.update(block)',
    "print('ready', digest.hexdigest(), flush=True)",
    '',
  ].join('\n');
  return workloadImage(`debian-model-${options.modelBytes}-${options.shardBytes}-${options.shardsLoaded}`, {
    layers: [{ copyFrom: base }, { copyFrom: withPython }, modelLayer(options), { files: { '/app/serve.py': serve } }],
    cmd: ['python3', '/app/serve.py'],
    env: ['PYTHONDONTWRITEBYTECODE=1'],
  });
}

/** The same shape at test size: busybox, model shards, a shell script that loads the first shards. */
export async function busyboxModelImage(options: ModelImageOptions): Promise<WorkloadImage> {
  const loaded = shardNames(options)
    .slice(0, options.shardsLoaded)
    .map((name) => `/models/${name}`);
  const start = [
    '#!/bin/sh',
    'cat /models/index.json > /dev/null',
    `sum=$(cat ${loaded.join(' ')} | sha256sum)`,
    'echo "ready ${sum%% *}"',
    '',
  ].join('\n');
  return workloadImage(`busybox-model-${options.modelBytes}-${options.shardBytes}-${options.shardsLoaded}`, {
    withBusybox: true,
    layers: [modelLayer(options), { files: { '/app/start.sh': start } }],
    cmd: ['sh', '/app/start.sh'],
  });
}

function shardNames({ modelBytes, shardBytes }: ModelImageOptions): string[] {
  if (!(shardBytes > 0) || modelBytes % shardBytes !== 0)
    throw new Error(`the model (${modelBytes} B) must be a whole number of shards of ${shardBytes} B`);
  const count = modelBytes / shardBytes;
  const width = String(count).length;
  return Array.from({ length: count }, (_, i) => `shard-${String(i + 1).padStart(width, '0')}-of-${count}.bin`);
}

function modelLayer(options: ModelImageOptions): LayerSpec {
  const names = shardNames(options);
  if (!(options.shardsLoaded >= 1 && options.shardsLoaded <= names.length))
    throw new Error(`shardsLoaded must be 1…${names.length}, got ${options.shardsLoaded}`);
  const index = { shards: names, loadAtStart: names.slice(0, options.shardsLoaded) };
  return {
    files: { '/models/index.json': `${JSON.stringify(index)}\n` },
    moreRandomFiles: names.map((name) => ({ path: `/models/${name}`, sizeBytes: options.shardBytes, seed: `e2e-model:${name}` })),
  };
}

async function rootfsOrThrow(include: string[]): Promise<string> {
  const rootfs = await debianRootfs(include);
  if (typeof rootfs !== 'string') throw new Error(`cannot build the Debian rootfs: ${rootfs.skip}`);
  return rootfs;
}

/**
 * Builds (or finds in /var/tmp) the plain image of `build` and its optimized eStargz form. The
 * cache key covers the build spec (copied directories by path: they are themselves cached by
 * their inputs) and FORMAT.
 */
async function workloadImage(name: string, build: Omit<BuildOptions, 'dir' | 'tag'>): Promise<WorkloadImage> {
  if (!fs.existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first`);
  const key = createHash('sha256')
    .update(JSON.stringify([FORMAT, build]))
    .digest('hex')
    .slice(0, 12);
  const dir = `/var/tmp/starling-e2e-${name}-${key}`;
  const summaryFile = path.join(dir, 'image.json');
  if (fs.existsSync(summaryFile)) return JSON.parse(await fsp.readFile(summaryFile, 'utf8')) as WorkloadImage;

  console.error(`building the image ${name} in ${dir} (cached for later runs) ...`);
  await fsp.rm(dir, { recursive: true, force: true });
  await fsp.mkdir(dir, { recursive: true });
  const plain = await buildImage({ ...build, dir: path.join(dir, 'build'), tag: 'plain' });
  const lazyLayout = path.join(dir, 'lazy');
  const recordFile = path.join(dir, 'record.jsonl');
  const optimize = await run(
    process.execPath,
    [CLI, 'optimize', `oci:${plain.layoutDir}:plain`, `oci:${lazyLayout}:lazy`, '--record-out', recordFile, '--tmp-dir', dir],
    { timeoutMs: 1_800_000 },
  );
  if (optimize.code !== 0) throw new Error(`starling optimize failed (${optimize.code}):\n${optimize.stderr}`);
  // The workload's output goes to optimize's stderr.
  const readyLine = `${optimize.stdout}\n${optimize.stderr}`.split('\n').find((line) => line.startsWith('ready '));
  if (!readyLine) throw new Error(`the workload printed no ready line under starling optimize:\n${optimize.stderr}`);

  const plainLayers = (await layoutLayers(plain.layoutDir, 'plain')).map(({ digest, size }) => ({ digest, size }));
  const lazyLayers: LazyLayer[] = [];
  for (const { digest, size, annotations } of await layoutLayers(lazyLayout, 'lazy')) {
    const tocDigest = annotations?.[TOC_DIGEST_ANNOTATION];
    if (!tocDigest) throw new Error(`optimized layer ${digest} has no ${TOC_DIGEST_ANNOTATION} annotation`);
    lazyLayers.push({
      digest,
      size,
      tocDigest,
      neededBytes: await lazyStartBytes(path.join(lazyLayout, 'blobs/sha256', digest.slice(7)), tocDigest),
    });
  }
  const recorded = (await fsp.readFile(recordFile, 'utf8')).split('\n').filter((line) => line.trim()).length;
  const sum = (layers: ImageLayer[]) => layers.reduce((n, l) => n + l.size, 0);
  const image: WorkloadImage = {
    name,
    dir,
    plain: { layout: plain.layoutDir, tag: 'plain', layers: plainLayers, bytes: sum(plainLayers) },
    lazy: {
      layout: lazyLayout,
      tag: 'lazy',
      layers: lazyLayers,
      bytes: sum(lazyLayers),
      neededBytes: lazyLayers.reduce((n, l) => n + l.neededBytes, 0),
    },
    recordedFiles: recorded,
    readyLine: readyLine.trim(),
  };
  await fsp.writeFile(summaryFile, `${JSON.stringify(image, null, 1)}\n`);
  return image;
}

/** What the snapshotter must fetch to start from a layer: its prefetch range, its TOC and its footer. */
async function lazyStartBytes(blob: string, tocDigest: string): Promise<number> {
  const source = await fileSource(blob);
  try {
    const reader = await openEstargz(source, { tocDigest });
    return prefetchLength(reader) + (source.size - reader.tocOffset);
  } finally {
    await source.close();
  }
}
