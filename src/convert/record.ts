import { readFile } from 'node:fs/promises';
import { UserError } from '../common/errors.js';

/** One line of `ctr-remote image optimize --record-out`: a file the workload read at start-up. */
interface RecordLine {
  path: string;
  manifestDigest: string;
  layerIndex: number;
}

/** Recorded paths per manifest digest and layer index, in recording order. */
export type Recording = Map<string, Map<number, string[]>>;

export async function readRecording(file: string): Promise<Recording> {
  const text = await readFile(file, 'utf8').catch((error: Error) => {
    throw new UserError(`cannot read --record-in ${file}: ${error.message}`);
  });
  const recording: Recording = new Map();
  text.split('\n').forEach((line, index) => {
    if (line.trim() === '') return;
    let parsed: Partial<RecordLine>;
    try {
      parsed = JSON.parse(line) as Partial<RecordLine>;
    } catch (error) {
      throw new UserError(`--record-in ${file} line ${index + 1}: not JSON (${(error as Error).message})`);
    }
    const { path, manifestDigest, layerIndex } = parsed;
    if (
      typeof path !== 'string' ||
      typeof manifestDigest !== 'string' ||
      typeof layerIndex !== 'number' ||
      !Number.isInteger(layerIndex) ||
      layerIndex < 0
    ) {
      throw new UserError(`--record-in ${file} line ${index + 1}: expected {"path","manifestDigest","layerIndex"}`);
    }
    const layers = recording.get(manifestDigest) ?? new Map<number, string[]>();
    recording.set(manifestDigest, layers);
    const paths = layers.get(layerIndex) ?? [];
    layers.set(layerIndex, paths);
    if (!paths.includes(path)) paths.push(path);
  });
  return recording;
}
