// A separate process serving one lazy layer, for tests that kill the server under a mount:
//   node --import tsx test/lazy/serve-layer.ts '{"url":…,"tocDigest":…,"mountpoint":…,"cacheDir":…}'
// Prints "ready" once mounted, then serves until killed.
import { HttpRangeSource, mountLazyLayer } from '../../src/lazy/index.js';

const config = JSON.parse(process.argv[2] ?? '{}') as Record<string, unknown>;
const field = (name: string): string => {
  const value = config[name];
  if (typeof value !== 'string') throw new Error(`serve-layer: "${name}" missing from ${process.argv[2]}`);
  return value;
};
const source = await HttpRangeSource.open(field('url'));
await mountLazyLayer({
  source,
  tocDigest: field('tocDigest'),
  mountpoint: field('mountpoint'),
  cacheDir: field('cacheDir'),
  prefetch: false,
});
console.log('ready');
