// One node's lazy start in bench/swarm-lazy.ts, run inside the node's network namespace:
//   node --import tsx bench/lib/lazy-reader.ts '{"url":…,"tocDigest":…,"mountpoint":…,"cacheDir":…,"files":[…],"goFile":…}'
// Prints "ready", waits until `goFile` exists (it holds the common start time, ms since the epoch),
// then mounts the eStargz layer through the node's Starling peer (footer, TOC, prefetch of the
// prioritized files), reads the workload's files in the order they were recorded, and prints one
// line `RESULT {json}`: when the mount was ready and when the last file had been read (seconds from
// the common start), what the mount fetched, and a digest over every file read (path and bytes) so
// the bench can check the content against the original rootfs.
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import { HttpRangeSource, mountLazyLayer } from '../../src/lazy/index.js';
import { readFilesDigest } from './debian-image.js';

interface ReaderArgs {
  url: string;
  tocDigest: string;
  mountpoint: string;
  cacheDir: string;
  files: string[];
  goFile: string;
}

const args = JSON.parse(process.argv[2] ?? '{}') as ReaderArgs;
await fsp.mkdir(args.mountpoint, { recursive: true });
console.log('ready');
while (!fs.existsSync(args.goFile)) await new Promise((resolve) => setTimeout(resolve, 2));
const t0 = Number(await fsp.readFile(args.goFile, 'utf8'));
const since = () => (Date.now() - t0) / 1000;

const http = await HttpRangeSource.open(args.url);
// Each request's span, for the timeline in the log (--keep-logs).
const requests: Array<{ offset: number; length: number; start: number; end: number }> = [];
const source = {
  size: http.size,
  counters: http.counters,
  async read(offset: number, length: number) {
    const request = { offset, length, start: since(), end: NaN };
    requests.push(request);
    const bytes = await http.read(offset, length);
    request.end = since();
    return bytes;
  },
  async *stream(offset: number, length: number) {
    const request = { offset, length, start: since(), end: NaN };
    requests.push(request);
    yield* http.stream(offset, length);
    request.end = since();
  },
};
const layer = await mountLazyLayer({
  source,
  tocDigest: args.tocDigest,
  mountpoint: args.mountpoint,
  cacheDir: args.cacheDir,
  onWarning: (message) => console.error(`warning: ${message}`),
});
const mounted = since();
const { digest, bytes } = await readFilesDigest(args.mountpoint, args.files);
const done = since();
const stats = layer.stats();
await layer.unmount();
console.log(`RESULT ${JSON.stringify({ t0, mounted, done, filesBytes: bytes, fetched: stats.sourceBytes, digest, requests })}`);
process.exit(0);
