import { createWriteStream } from 'node:fs';
import { rename, rm } from 'node:fs/promises';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import cliProgress from 'cli-progress';
import type { Command } from 'commander';
import { request } from 'undici';
import { UserError } from '../../common/errors.js';
import { itemAt } from '../../common/indexing.js';
import { createDigester, parseDigest } from '../../oci/digest.js';
import { parseImageReference } from '../../oci/reference.js';

/** Turns `registry/repo@digest` or a registry blob URL into the peer's mirror URL for that blob. */
export function blobUrlThroughPeer(target: string, peer: URL): { url: URL; digest: string } {
  if (/^https?:\/\//.test(target)) {
    const source = new URL(target);
    const match = /^\/v2\/(.+)\/blobs\/([^/]+)$/.exec(source.pathname);
    if (!match) {
      throw new UserError(`${target} is not a registry blob URL (expected http(s)://HOST/v2/NAME/blobs/DIGEST)`);
    }
    const name = itemAt(match, 1);
    const digest = itemAt(match, 2);
    parseDigest(digest);
    const url = new URL(`/v2/${name}/blobs/${digest}`, peer);
    url.searchParams.set('ns', source.host);
    return { url, digest };
  }
  let ref;
  try {
    ref = parseImageReference(target);
  } catch (error) {
    throw new UserError((error as Error).message);
  }
  if (!ref.digest) throw new UserError(`${target} names no blob: use REGISTRY/REPOSITORY@sha256:...`);
  const url = new URL(`/v2/${ref.repository}/blobs/${ref.digest}`, peer);
  url.searchParams.set('ns', ref.registry);
  return { url, digest: ref.digest };
}

/** The flags of `starling get` as commander parses them. */
interface GetFlags {
  output: string;
  peer: string;
  creds?: string;
  progress: boolean;
}

export function registerGetCommand(program: Command): void {
  program
    .command('get')
    .description('fetch a registry blob through the local peer (and so through the swarm), verifying its digest')
    .argument('<target>', 'REGISTRY/REPOSITORY@DIGEST or http(s)://REGISTRY/v2/NAME/blobs/DIGEST')
    .requiredOption('-o, --output <file>', 'where to write the blob')
    .option('--peer <url>', 'the local peer mirror', 'http://127.0.0.1:65001')
    .option('--creds <user:password>', 'registry credentials (sent as Basic auth through the peer)')
    .option('--no-progress', 'no progress bar')
    .action(async (target: string, options: GetFlags) => {
      const { url, digest } = blobUrlThroughPeer(target, new URL(options.peer));
      const headers: Record<string, string> = {};
      if (options.creds) headers.authorization = `Basic ${Buffer.from(options.creds).toString('base64')}`;
      let response;
      try {
        response = await request(url, { headers });
      } catch (error) {
        throw new UserError(`cannot reach the peer at ${options.peer}: ${(error as Error).message}`);
      }
      if (response.statusCode !== 200) {
        const body = await response.body.text();
        throw new UserError(`peer answered ${response.statusCode} for ${target}: ${body.slice(0, 500)}`);
      }
      const total = Number(response.headers['content-length'] ?? 0);
      const hasher = createDigester(parseDigest(digest).algorithm);
      const showBar = options.progress && process.stderr.isTTY;
      const bar = new cliProgress.SingleBar(
        { format: '{bar} {percentage}% | {value}/{total} bytes | {speed} MB/s', stream: process.stderr },
        cliProgress.Presets.shades_classic,
      );
      const started = performance.now();
      let received = 0;
      if (showBar) bar.start(total, 0, { speed: '0' });
      const meter = new Transform({
        transform(chunk: Buffer, _encoding, done) {
          hasher.update(chunk);
          received += chunk.length;
          if (showBar) bar.update(received, { speed: (received / 1e6 / ((performance.now() - started) / 1000)).toFixed(1) });
          done(null, chunk);
        },
      });
      const partial = `${options.output}.partial`;
      try {
        await pipeline(response.body, meter, createWriteStream(partial));
      } catch (error) {
        await rm(partial, { force: true });
        throw new UserError(`download of ${target} broke off after ${received} bytes: ${(error as Error).message}`);
      } finally {
        if (showBar) bar.stop();
      }
      const actual = `${parseDigest(digest).algorithm}:${hasher.digest('hex')}`;
      if (actual !== digest) {
        await rm(partial, { force: true });
        throw new UserError(`downloaded content has digest ${actual}, expected ${digest}; nothing written`);
      }
      await rename(partial, options.output);
      const seconds = (performance.now() - started) / 1000;
      console.error(`${options.output}: ${received} bytes, ${digest}, ${(received / 1e6 / seconds).toFixed(1)} MB/s`);
    });
}
