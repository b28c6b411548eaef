// The web console in a real headless Chromium (Debian's, driven by playwright-core) against a
// real manager process serving the built console, a real registry with a pushed image, a
// scheduler, a seed and two peers: log in, see the peers with their labels, start a preheat
// from the page and watch it finish, see where the bytes of a pull came from.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import { chromium, type Browser, type Page } from 'playwright-core';
import { request } from 'undici';
import { buildImage, pushImage, type BuiltImage } from '../fixtures/images.js';
import { STARLING_CLI, startPeer, startScheduler, type RunningPeerProcess } from '../fixtures/peer.js';
import { freePort, makeTempDir, spawnService, waitFor, waitForHttp, type TempDir } from '../fixtures/processes.js';
import { startRegistry, type Registry } from '../fixtures/registry.js';
import { itemAt } from '../../src/common/indexing.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const CONSOLE_INDEX = path.join(ROOT, 'console/dist/index.html');
const CHROMIUM = '/usr/bin/chromium';
const MiB = 1024 * 1024;
const IMAGE = 'console/app:v1';

describe('web console in headless Chromium', { timeout: 100_000 }, () => {
  let work: TempDir;
  let registry: Registry;
  let image: BuiltImage;
  let managerUrl: string;
  let browser: Browser;
  let peer: RunningPeerProcess;
  let schedulerAddress: string;
  const adminToken = `admin-${randomBytes(16).toString('hex')}`;
  const stops: Array<() => Promise<unknown>> = [];

  const api = async (method: 'GET' | 'POST', pathname: string, body?: unknown, token = adminToken) => {
    const response = await request(`${managerUrl}/api/v1${pathname}`, {
      method,
      headers: { authorization: `Bearer ${token}`, ...(body ? { 'content-type': 'application/json' } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    });
    return { status: response.statusCode, body: (await response.body.json()) as any };
  };

  /** A fresh browser context (its own sessionStorage), logged in with `token`. */
  const loggedIn = async (token = adminToken): Promise<Page> => {
    const page = await (await browser.newContext()).newPage();
    await page.goto(managerUrl);
    await page.getByLabel('Personal access token').fill(token);
    await page.getByRole('button', { name: 'Log in' }).click();
    await page.getByRole('heading', { name: 'Overview' }).waitFor();
    return page;
  };

  const goTo = async (page: Page, link: string, heading = link) => {
    await page.getByRole('navigation', { name: 'Pages' }).getByRole('link', { name: link, exact: true }).click();
    await page.getByRole('heading', { name: heading, level: 1 }).waitFor();
  };

  before(async () => {
    // A missing build or browser is a failure that says what to do, never a silent skip.
    assert.ok(existsSync(CONSOLE_INDEX), `the web console is not built (${CONSOLE_INDEX} is missing): run \`npm run build\` first`);
    assert.ok(existsSync(STARLING_CLI), `the CLI is not built (${STARLING_CLI} is missing): run \`npm run build\` first`);
    assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: run scripts/install-deps.sh (Debian package chromium)`);

    work = await makeTempDir('starling-console-');
    [registry, image] = await Promise.all([
      startRegistry({ host: '127.0.3.9' }),
      buildImage({
        layers: [
          { sizeBytes: 16 * MiB, seed: 'console-layer-1' },
          { sizeBytes: 8 * MiB, seed: 'console-layer-2' },
        ],
      }),
    ]);
    stops.push(() => registry.stop());
    await pushImage(image.layoutDir, image.tag, registry.host, IMAGE);

    const clusterToken = path.join(work.path, 'cluster.token');
    await writeFile(clusterToken, randomBytes(24).toString('hex'));
    await writeFile(path.join(work.path, 'admin.token'), adminToken);
    const port = await freePort('127.0.3.1');
    managerUrl = `http://127.0.3.1:${port}`;
    // The manager serves the console from console/dist, its default folder.
    const manager = await spawnService({
      cmd: process.execPath,
      args: [
        STARLING_CLI,
        'manager',
        '--listen',
        `127.0.3.1:${port}`,
        '--data-dir',
        path.join(work.path, 'manager'),
        '--cluster-token-file',
        clusterToken,
        '--admin-token-file',
        path.join(work.path, 'admin.token'),
        '--insecure-registry',
        registry.host,
      ],
      name: 'starling-manager-console',
    });
    stops.push(() => manager.stop());
    await waitForHttp(`${managerUrl}/healthz`, 20_000, manager);

    const scheduler = await startScheduler({ ip: '127.0.3.2', clusterTokenFile: clusterToken, extraArgs: ['--manager', managerUrl] });
    stops.push(() => scheduler.stop());
    schedulerAddress = scheduler.address;
    const common = (ip: string, hostId: string, labels: string[]) => [
      '--manager',
      managerUrl,
      '--upload-listen',
      `${ip}:0`,
      '--cluster-token-file',
      clusterToken,
      '--host-id',
      hostId,
      ...labels.flatMap((label) => ['--label', label]),
    ];
    // The seed's origin downloads are slowed so that the preheat is seen running before it ends.
    const [seed, peer1, peer2] = await Promise.all([
      startPeer({
        ip: '127.0.3.3',
        insecure: [registry.host],
        extraArgs: [...common('127.0.3.3', 'console-seed', ['zone=z1', 'rack=r1']), '--seed', '--download-rate-limit', '12MB'],
      }),
      startPeer({ ip: '127.0.3.4', insecure: [registry.host], extraArgs: common('127.0.3.4', 'console-peer-1', ['zone=z1', 'rack=r2']) }),
      startPeer({ ip: '127.0.3.5', insecure: [registry.host], extraArgs: common('127.0.3.5', 'console-peer-2', ['zone=z2', 'rack=r3']) }),
    ]);
    stops.push(
      () => seed.stop(),
      () => peer1.stop(),
      () => peer2.stop(),
    );
    peer = peer1;

    browser = await chromium.launch({
      executablePath: CHROMIUM,
      headless: true,
      args: ['--no-sandbox', '--disable-background-networking'],
    });
    stops.push(() => browser.close());
    await waitFor(async () => (await api('GET', '/peers?state=active')).body.length === 3, 20_000, 'the seed and two peers registered');
  });

  after(async () => {
    for (const stop of stops.reverse()) await stop().catch(() => undefined);
    await work?.remove();
  });

  it('refuses a bad token with a visible message', async () => {
    const page = await (await browser.newContext()).newPage();
    await page.goto(`${managerUrl}/peers`);
    await page.getByLabel('Personal access token').fill('not-a-token-of-this-manager');
    await page.getByRole('button', { name: 'Log in' }).click();
    const alert = page.getByRole('alert');
    await alert.waitFor();
    assert.match(await alert.innerText(), /a valid personal access token is required/);
    assert.equal(await page.getByRole('navigation', { name: 'Pages' }).count(), 0, 'still on the login page');
    await page.context().close();
  });

  it('logs in as admin and shows the seed and peers with labels and health, the scheduler and the cluster settings', async () => {
    const page = await loggedIn();
    await goTo(page, 'Peers');
    const rows = page.getByRole('table', { name: 'peers' }).locator('tbody tr');
    await waitFor(async () => (await rows.count()) === 3, 10_000, 'three peer rows');
    const seedRow = rows.filter({ hasText: 'console-seed' });
    const seedText = await seedRow.innerText();
    for (const expected of ['seed', 'zone=z1', 'rack=r1', 'active', '127.0.3.3:'])
      assert.ok(seedText.includes(expected), `seed row shows ${expected}: ${seedText}`);
    const peerText = await rows.filter({ hasText: 'console-peer-2' }).innerText();
    for (const expected of ['peer', 'zone=z2', 'rack=r3', 'active'])
      assert.ok(peerText.includes(expected), `peer row shows ${expected}: ${peerText}`);
    assert.ok(!peerText.includes('seed'), 'a normal peer is not marked as a seed');

    // Filtering by kind asks the API for seeds only.
    await page.getByLabel('Kind').selectOption('seed');
    await waitFor(
      async () => (await rows.count()) === 1 && (await rows.first().innerText()).includes('console-seed'),
      10_000,
      'only the seed listed',
    );

    await goTo(page, 'Schedulers');
    const scheduler = page.getByRole('row').filter({ hasText: schedulerAddress });
    assert.match(await scheduler.innerText(), /active/);

    await goTo(page, 'Clusters');
    const cluster = page.getByRole('region').filter({ hasText: 'default' }).first();
    const clusterText = await cluster.innerText();
    assert.match(clusterText, /candidate parents\s+5/);
    assert.match(clusterText, /zone\s+100\s+yes/);
    assert.match(clusterText, /shape\s+adaptive/);

    // The admin switches the cluster to the pipeline shape, to the mesh, and back.
    const form = page.getByRole('form', { name: 'change limits of default' });
    for (const [shape, shown] of [
      ['pipeline', /shape\s+pipeline: 1 child per node, 1 per seed/],
      ['mesh', /shape\s+mesh/],
      ['adaptive', /shape\s+adaptive/],
    ] as const) {
      await form.getByLabel('Shape').selectOption(shape);
      await form.getByRole('button', { name: 'Save limits' }).click();
      await waitFor(async () => shown.test(await cluster.innerText()), 10_000, `the cluster shown with the ${shape} shape`);
    }

    // The session survives a reload (sessionStorage), and logging out forgets it.
    await page.reload();
    await page.getByRole('heading', { name: 'Clusters', level: 1 }).waitFor();
    await page.getByRole('button', { name: 'Log out' }).click();
    await page.getByLabel('Personal access token').waitFor();
    await page.reload();
    await page.getByLabel('Personal access token').waitFor();
    await page.context().close();
  });

  it('starts a preheat from the page and shows it running, then succeeded with every layer done', async () => {
    const page = await loggedIn();
    await goTo(page, 'Jobs');
    await page.getByLabel('Image').fill(`${registry.host}/${IMAGE}`);
    await page.getByLabel('Platform').fill('linux/amd64');
    await page.getByLabel('Scope').selectOption('seeds');
    await page.getByRole('button', { name: 'Start preheat' }).click();
    await page.waitForURL(/\/jobs\/\d+$/, { timeout: 15_000 });
    const jobId = Number(new URL(page.url()).pathname.split('/').pop());
    await page.getByRole('heading', { name: `Job #${jobId}` }).waitFor();

    // Watch the page (no reload): the state it shows over time, until the job ends.
    const badge = page.locator('section.panel h2 .badge');
    const seen: string[] = [];
    await waitFor(
      async () => {
        const state = (await badge.innerText()).trim();
        if (seen.at(-1) !== state) seen.push(state);
        return state === 'succeeded' || state === 'failed';
      },
      60_000,
      'the job page to show the job finished',
      100,
    );
    assert.deepEqual(seen.slice(-1), ['succeeded'], `states seen on the page: ${seen.join(' → ')}`);
    assert.ok(seen.includes('running') || seen.includes('pending'), `the page showed the job before it ended: ${seen.join(' → ')}`);

    // Every layer and the image config (a blob every pull reads too), each on the one seed.
    const rows = page.getByRole('table', { name: 'layers' }).locator('tbody tr');
    const blobs = image.layers.length + 1;
    assert.equal(await rows.count(), blobs);
    for (const layer of image.layers)
      assert.equal(await rows.filter({ hasText: layer.digest.slice(0, 'sha256:'.length + 12) }).count(), 1, `layer ${layer.digest} listed`);
    for (const text of await rows.allInnerTexts()) {
      assert.match(text, /1 of 1/, text);
      assert.match(text, /\(100%\)/, text);
    }
    assert.match(await page.getByTestId('job-fetches').innerText(), new RegExp(`^${blobs} of ${blobs} succeeded$`));
    assert.equal((await api('GET', `/jobs/${jobId}`)).body.state, 'succeeded');

    await goTo(page, 'Jobs');
    const listed = page
      .getByRole('table', { name: 'jobs' })
      .getByRole('row')
      .filter({ hasText: `#${jobId}` });
    await waitFor(async () => /succeeded/.test(await listed.innerText()), 10_000, 'the job list to show the job succeeded');
    await page.context().close();
  });

  it("shows the API's error for an image the registry does not have", async () => {
    const body = { type: 'preheat', image: `${registry.host}/console/nothing:v9`, platform: 'linux/amd64', scope: 'seeds' };
    const refused = await api('POST', '/jobs', body);
    assert.ok(refused.status >= 400 && refused.status < 500, JSON.stringify(refused.body));
    const page = await loggedIn();
    await goTo(page, 'Jobs');
    await page.getByLabel('Image').fill(body.image);
    await page.getByRole('button', { name: 'Start preheat' }).click();
    const alert = page.getByRole('alert');
    await alert.waitFor();
    const text = await alert.innerText();
    assert.ok(text.includes(refused.body.error.message), `page shows "${text}", the API said "${refused.body.error.message}"`);
    assert.ok(text.includes(`HTTP ${refused.status}`), text);
    assert.match(page.url(), /\/jobs$/, 'no job page was opened');
    await page.context().close();
  });

  it('shows who holds each layer after a pull through a peer, and bytes from seeds versus the origin', async () => {
    const layer = itemAt(image.layers, 0);
    const response = await request(`${peer.url}/v2/console/app/blobs/${layer.digest}?ns=${registry.host}`);
    assert.equal(response.statusCode, 200);
    const hash = createHash('sha256');
    for await (const chunk of response.body) hash.update(chunk);
    assert.equal(`sha256:${hash.digest('hex')}`, layer.digest);
    // Peers report what they hold with their keep-alives (every 5 s): wait until the seed has
    // reported every preheated blob complete and the peer the layer it pulled.
    type TaskView = {
      digest: string;
      size: number;
      peers: Array<{ hostId: string; complete: boolean }>;
      bytesFromSeeds: number;
      bytesFromPeers: number;
      bytesFromOrigin: number;
    };
    const task = await waitFor(
      async () => {
        const tasks = (await api('GET', '/tasks')).body as TaskView[];
        const settled = image.layers.every((l) =>
          tasks.find((t) => t.digest === l.digest)?.peers.some((p) => p.hostId === 'console-seed' && p.complete),
        );
        const found = tasks.find((t) => t.digest === layer.digest);
        return settled && tasks.every((t) => t.peers.every((p) => p.complete)) && found?.peers.some((p) => p.hostId === 'console-peer-1')
          ? found
          : undefined;
      },
      20_000,
      'the seed and the peer to report what they hold',
      250,
    );
    assert.ok(task.bytesFromSeeds + task.bytesFromPeers >= layer.size, `the pull came from the swarm: ${JSON.stringify(task)}`);
    const overview = (await api('GET', '/overview')).body;

    const page = await loggedIn();
    await goTo(page, 'Tasks');
    const row = page
      .getByRole('table', { name: 'tasks' })
      .getByRole('row')
      .filter({ hasText: layer.digest.slice(0, 'sha256:'.length + 12) });
    const text = await row.innerText();
    assert.match(text, /console-seed\s*seed/, text);
    assert.match(text, /console-peer-1/, text);
    assert.match(text, /16\.0 MiB/, text);

    await goTo(page, 'Overview');
    const ratio = page.getByTestId('p2p-ratio');
    await waitFor(async () => (await ratio.innerText()) !== '–', 10_000, 'the hit ratio');
    const shown = Number((await ratio.innerText()).replace('%', ''));
    assert.ok(overview.bytes.p2pRatio > 0, JSON.stringify(overview));
    assert.ok(Math.abs(shown - overview.bytes.p2pRatio * 100) <= 1, `page shows ${shown}%, API says ${overview.bytes.p2pRatio}`);
    const verdict = await page.getByRole('region', { name: 'Is P2P working?' }).innerText();
    assert.match(verdict, /from seeds/);
    assert.match(verdict, /from the origin/);
    await page.context().close();
  });

  it('gives a read-only user no controls that change anything', async () => {
    const user = await api('POST', '/users', { name: 'viewer', role: 'read-only' });
    assert.equal(user.status, 201, JSON.stringify(user.body));
    const token = await api('POST', '/tokens', { name: 'console test', userId: user.body.id });
    assert.equal(token.status, 201, JSON.stringify(token.body));
    const page = await loggedIn(token.body.token);
    await goTo(page, 'Jobs');
    await page.getByText('Your role may read only').waitFor();
    assert.equal(await page.getByRole('button', { name: 'Start preheat' }).count(), 0);
    await page.getByRole('table', { name: 'jobs' }).waitFor();
    await goTo(page, 'Clusters');
    await page.getByRole('region').first().waitFor();
    assert.equal(await page.getByRole('button', { name: 'Save limits' }).count(), 0);
    await page.context().close();
  });
});
