/** `starling optimize`: record the files a workload reads at start-up and put them first. */
export { optimizeImage, DEFAULT_PERIOD_MS } from './optimize.js';
export { parseJsonArgv, resolveUser } from './workload.js';
