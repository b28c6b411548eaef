import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { extname, join, normalize, sep } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { ManagerError } from '../../errors.js';

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
  '.map': 'application/json',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.woff2': 'font/woff2',
  '.txt': 'text/plain; charset=utf-8',
};

/**
 * Serves the built web console (a single-page app) from `dir`: files as they are, and
 * index.html for any other page path so that client-side routes survive a reload. Looked up
 * per request, so a console built after the manager started is served too.
 */
export function registerConsole(app: FastifyInstance, dir: string): void {
  const serve = async (urlPath: string, reply: import('fastify').FastifyReply) => {
    if (urlPath.startsWith('/api/')) throw new ManagerError(404, 'not_found', `no route GET ${urlPath}`);
    const relative = normalize(decodeURIComponent(urlPath)).replace(/^([/\\])+/, '');
    const file = join(dir, relative);
    if (file !== dir && !file.startsWith(dir.endsWith(sep) ? dir : dir + sep))
      throw new ManagerError(404, 'not_found', `no such file ${urlPath}`);
    let target = (await isFile(file)) ? file : undefined;
    // Page routes have no extension; asset paths that do must exist.
    if (!target && !extname(relative)) target = (await isFile(join(dir, 'index.html'))) ? join(dir, 'index.html') : undefined;
    if (!target) {
      const built = await isFile(join(dir, 'index.html'));
      throw new ManagerError(
        404,
        'not_found',
        built ? `no such file ${urlPath}` : `the web console is not built (no ${join(dir, 'index.html')})`,
      );
    }
    const immutable = target.includes(`${sep}assets${sep}`);
    reply
      .header('content-type', TYPES[extname(target)] ?? 'application/octet-stream')
      .header('cache-control', immutable ? 'public, max-age=31536000, immutable' : 'no-cache')
      .header('x-content-type-options', 'nosniff');
    return reply.send(createReadStream(target));
  };
  app.get('/', (request, reply) => serve('/', reply));
  app.get('/*', (request, reply) => serve(request.url.replace(/\?.*/s, ''), reply));
}

async function isFile(path: string): Promise<boolean> {
  try {
    return (await stat(path)).isFile();
  } catch {
    return false;
  }
}
