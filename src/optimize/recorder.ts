// The files a workload read, in first-access order, each with the layer that served it: the
// topmost layer holding the file, since overlayfs opens a lower file only in that layer. Written
// in ctr-remote's record format (`ctr-remote image optimize --record-out`): one JSON object per
// line, {"path","manifestDigest","layerIndex"}, paths as TOC names (no leading slash).
import { writeFile } from 'node:fs/promises';
import type { Recording } from '../convert/record.js';

export interface RecordedFile {
  path: string;
  layerIndex: number;
}

export class AccessRecorder {
  private readonly seen = new Set<string>();
  private readonly order: RecordedFile[] = [];
  private active = false;

  /** Accesses count from now on (mounting and setting up the sandbox read nothing worth keeping). */
  start(): void {
    this.active = true;
  }

  stop(): void {
    this.active = false;
  }

  /** For one layer's onAccess hook: the first access of each (layer, path) is kept. */
  hook(layerIndex: number): (path: string) => void {
    return (path) => {
      if (!this.active) return;
      const key = `${layerIndex}\0${path}`;
      if (this.seen.has(key)) return;
      this.seen.add(key);
      this.order.push({ path, layerIndex });
    };
  }

  get files(): readonly RecordedFile[] {
    return this.order;
  }

  /** The recording as convertImage takes it (what `convert --record-in` would read back). */
  toRecording(manifestDigest: string): Recording {
    const layers = new Map<number, string[]>();
    for (const { path, layerIndex } of this.order) {
      const paths = layers.get(layerIndex) ?? [];
      layers.set(layerIndex, paths);
      paths.push(path);
    }
    return new Map([[manifestDigest, layers]]);
  }

  /** ctr-remote's record lines (same key order as its Go encoder). */
  toLines(manifestDigest: string): string {
    return this.order.map(({ path, layerIndex }) => `${JSON.stringify({ path, manifestDigest, layerIndex })}\n`).join('');
  }

  async write(file: string, manifestDigest: string): Promise<void> {
    await writeFile(file, this.toLines(manifestDigest));
  }
}
