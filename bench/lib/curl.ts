// The benchmark client: curl writing to /dev/null. It is cheap on CPU (one recv loop in C),
// so on a 2-core machine it leaves the other core to the server being measured.

import { run } from '../../test/fixtures/processes.js';

export interface Transfer {
  status: number;
  bytes: number;
  /** Wall time of the transfer as curl saw it (connect to last byte). */
  seconds: number;
  /** Bytes per second, curl's own figure (bytes / total time). */
  speed: number;
  ttfbSeconds: number;
}

/** GET `url`, body discarded; throws unless the status and byte count are as expected. */
export async function curlGet(url: string, expect: { status?: number; bytes?: number } = {}, timeoutMs = 600_000): Promise<Transfer> {
  const res = await run(
    'curl',
    [
      '-s',
      '-o',
      '/dev/null',
      '--noproxy',
      '*',
      '-w',
      '%{http_code} %{size_download} %{time_total} %{speed_download} %{time_starttransfer}',
      url,
    ],
    { timeoutMs },
  );
  if (res.code !== 0) throw new Error(`curl ${url} failed (exit ${res.code} ${res.signal ?? ''}): ${res.stderr.trim()}`);
  const [status, bytes, seconds, speed, ttfb] = res.stdout.trim().split(' ').map(Number) as [number, number, number, number, number];
  const transfer = { status, bytes, seconds, speed, ttfbSeconds: ttfb };
  if (status !== (expect.status ?? 200)) throw new Error(`GET ${url}: HTTP ${status}`);
  if (expect.bytes !== undefined && bytes !== expect.bytes) throw new Error(`GET ${url}: ${bytes} bytes, expected ${expect.bytes}`);
  return transfer;
}
