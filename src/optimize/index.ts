/** `starling optimize`: record the files a workload reads at start-up and put them first. */
export { optimizeImage, DEFAULT_PERIOD_MS, type OptimizeOptions, type OptimizeResult } from './optimize.js';
export { AccessRecorder, type RecordedFile } from './recorder.js';
export { runSandbox, type SandboxOptions, type SandboxResult } from './sandbox.js';
export { buildWorkload, parseJsonArgv, resolveUser, type Workload, type WorkloadOverrides, type ResolvedUser } from './workload.js';
export { mountLayers, readMergedFile, type MountedLayers } from './layers.js';
