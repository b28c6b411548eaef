/*
 * eStargz conversion throughput: Starling's writer vs the Go reference (stargz-snapshotter v0.12
 * estargz.Build, through test-tools/estargz-conformance) on the same layer, gzip level and chunk
 * size, in the same run. The layer is a tar of directories from this machine (Python's stdlib
 * and the Go toolchain: source text plus binaries, ~430 MB), built once and cached in the temp dir.
 *
 * With --zstd both sides build zstd:chunked: Starling at libzstd level 3, Go's zstdchunked
 * Compressor at zstd.SpeedDefault (what its converter uses; klauspost's "default" ≈ level 3).
 * Both use every core (Go: GOMAXPROCS; Starling: one compression worker per core).
 *
 *   npx tsx bench/estargz-convert.ts [--level 6] [--chunk-size 4194304] [--runs 1] [--zstd] [--dirs /usr/lib/python3.11,...]
 */
import { execFile } from 'node:child_process';
import { createReadStream, createWriteStream, existsSync } from 'node:fs';
import { rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs, promisify } from 'node:util';
import { buildEstargz, fileSource, openEstargz } from '../src/estargz/index.js';

const run = promisify(execFile);
const { values } = parseArgs({
  options: {
    level: { type: 'string', default: '6' },
    'chunk-size': { type: 'string', default: String(4 << 20) },
    runs: { type: 'string', default: '1' },
    dirs: { type: 'string', default: '/usr/lib/python3.11,/usr/lib/python3,/usr/lib/go-1.19' },
    zstd: { type: 'boolean', default: false },
  },
});
const zstd = values.zstd;
const level = zstd ? 3 : Number(values.level);
const GO_ZSTD_SPEED_DEFAULT = 2;
const chunkSize = Number(values['chunk-size']);
const runs = Number(values.runs);
const harness = resolve(import.meta.dirname, '../test-tools/estargz-conformance/bin/estargz-conformance');
if (!existsSync(harness)) throw new Error(`Go harness missing: run scripts/build-test-tools.sh (${harness})`);

const dirs = values.dirs.split(',').filter((d) => existsSync(d));
const layer = join(tmpdir(), `starling-bench-layer-${dirs.map((d) => d.replace(/\W+/g, '_')).join('-')}.tar`);
if (!existsSync(layer)) {
  console.error(`building ${layer} from ${dirs.join(' ')} ...`);
  await run('tar', ['--format=pax', '--sort=name', '-cf', layer, ...dirs.map((d) => d.replace(/^\//, ''))], { cwd: '/' });
}
const inputBytes = (await stat(layer)).size;
const MB = 1e6;
const format = zstd ? `zstd:chunked (Starling level ${level}, Go SpeedDefault)` : `gzip level ${level}`;
console.log(`layer: ${(inputBytes / MB).toFixed(0)} MB tar; ${format}; chunk size ${chunkSize} bytes; ${runs} run(s) each`);

async function timeStarling(out: string): Promise<{ seconds: number; size: number; tocDigest: string }> {
  const start = process.hrtime.bigint();
  const result = await buildEstargz(createReadStream(layer, { highWaterMark: 1 << 20 }), createWriteStream(out), {
    level,
    chunkSize,
    compression: zstd ? 'zstd' : 'gzip',
  });
  return { seconds: Number(process.hrtime.bigint() - start) / 1e9, size: result.size, tocDigest: result.tocDigest };
}

async function timeGo(out: string): Promise<{ seconds: number; size: number; tocDigest: string }> {
  const start = process.hrtime.bigint();
  const args = ['build', '-in', layer, '-out', out, '-chunk-size', String(chunkSize)];
  args.push(...(zstd ? ['-zstd', '-level', String(GO_ZSTD_SPEED_DEFAULT)] : ['-level', String(level)]));
  const { stdout } = await run(harness, args, { maxBuffer: 1 << 20 });
  const result = JSON.parse(stdout) as { size: number; tocDigest: string }; // the harness's build report
  return { seconds: Number(process.hrtime.bigint() - start) / 1e9, size: result.size, tocDigest: result.tocDigest };
}

const best = { starling: Infinity, go: Infinity };
const sizes = { starling: 0, go: 0 };
const outputs = { starling: join(tmpdir(), 'starling-bench.esgz'), go: join(tmpdir(), 'go-bench.esgz') };
for (let i = 0; i < runs; i++) {
  // Alternate the order so neither side always gets the warmer page cache.
  for (const which of i % 2 === 0 ? (['starling', 'go'] as const) : (['go', 'starling'] as const)) {
    const r = which === 'starling' ? await timeStarling(outputs.starling) : await timeGo(outputs.go);
    best[which] = Math.min(best[which], r.seconds);
    sizes[which] = r.size;
    // Sanity: each output opens with its own TOC digest.
    const source = await fileSource(outputs[which]);
    await openEstargz(source, { tocDigest: r.tocDigest });
    await source.close();
    console.log(
      `  ${which.padEnd(8)} run ${i + 1}: ${r.seconds.toFixed(2)} s, ${(inputBytes / MB / r.seconds).toFixed(1)} MB/s, blob ${(r.size / MB).toFixed(1)} MB`,
    );
  }
}
const rate = (s: number) => inputBytes / MB / s;
console.log(`starling: ${rate(best.starling).toFixed(1)} MB/s (blob ${(sizes.starling / MB).toFixed(1)} MB)`);
console.log(`go:       ${rate(best.go).toFixed(1)} MB/s (blob ${(sizes.go / MB).toFixed(1)} MB)`);
console.log(`ratio starling/go: ${(rate(best.starling) / rate(best.go)).toFixed(2)}x`);
await Promise.all(Object.values(outputs).map((p) => rm(p, { force: true })));
