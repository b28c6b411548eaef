// A separate process serving one lazy layer, for tests that kill the server under a mount:
//   node --import tsx test/lazy/serve-layer.ts '{"url":…,"tocDigest":…,"mountpoint":…,"cacheDir":…}'
// Prints "ready" once mounted, then serves until killed.
import { HttpRangeSource, mountLazyLayer } from '../../src/lazy/index.js';

const { url, tocDigest, mountpoint, cacheDir } = JSON.parse(process.argv[2] ?? '{}') as Record<string, string>;
const source = await HttpRangeSource.open(url!);
await mountLazyLayer({ source, tocDigest: tocDigest!, mountpoint: mountpoint!, cacheDir: cacheDir!, prefetch: false });
console.log('ready');
