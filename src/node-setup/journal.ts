// The backup that lets `starling node-setup --undo` give the node back exactly what it had: each
// file's original bytes, mode and owner (or the fact that it did not exist), and the folders
// node-setup created, saved before the first change and never overwritten by later runs.

import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, chown, mkdir, readFile, rename, rm, rmdir, stat, writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { NodeSetupError } from './errors.js';

interface JournalFile {
  path: string;
  existed: boolean;
  mode?: number;
  uid?: number;
  gid?: number;
  /** The original bytes' file name in the backup folder. */
  backup?: string;
  /** sha256 of what node-setup wrote last: undo refuses to overwrite a file someone changed since. */
  written: string;
}

interface Journal {
  version: 1;
  files: JournalFile[];
  /** Folders node-setup created, parents first. */
  dirs: string[];
}

const JOURNAL = 'journal.json';

export interface FileWrite {
  path: string;
  content: string;
}

/** Reads a file, or undefined when it does not exist; other errors (permissions, a folder) name the file. */
export async function readIfExists(path: string): Promise<string | undefined> {
  try {
    return await readFile(path, 'utf8');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new NodeSetupError(`cannot read ${path}: ${(error as Error).message}`);
  }
}

/**
 * Writes each file whose content differs from what is there, first saving the originals in
 * `backupDir`. Returns the paths it changed.
 */
export async function applyWrites(backupDir: string, writes: readonly FileWrite[]): Promise<string[]> {
  const journal = await loadJournal(backupDir);
  const pending: FileWrite[] = [];
  for (const write of writes) {
    const current = await readBytes(write.path);
    if (current !== undefined && current.equals(Buffer.from(write.content))) continue;
    pending.push(write);
    if (journal.files.some((f) => f.path === resolve(write.path))) continue;
    const entry: JournalFile = { path: resolve(write.path), existed: current !== undefined, written: '' };
    if (current !== undefined) {
      const info = await stat(write.path);
      entry.mode = info.mode & 0o7777;
      entry.uid = info.uid;
      entry.gid = info.gid;
      entry.backup = `file-${journal.files.length}`;
      await mkdir(backupDir, { recursive: true, mode: 0o700 });
      await writeFile(join(backupDir, entry.backup), current, { mode: 0o600 });
    }
    journal.files.push(entry);
  }
  if (pending.length === 0) return [];
  // The originals are safe on disk before any of them changes.
  await saveJournal(backupDir, journal);
  for (const write of pending) {
    await makeParents(dirname(resolve(write.path)), journal);
    const entry = journal.files.find((f) => f.path === resolve(write.path));
    if (!entry) throw new Error(`no journal entry for ${write.path}`); // each pending write got one above
    await writeAtomically(write.path, Buffer.from(write.content), entry.existed ? entry : undefined);
    entry.written = sha256(Buffer.from(write.content));
    await saveJournal(backupDir, journal);
  }
  return pending.map((w) => w.path);
}

/**
 * Puts every file back as it was before the first run and removes the folders node-setup made,
 * then the backup itself. Refuses, changing nothing, when a file was changed by someone else since
 * node-setup wrote it (unless `force`). Returns the paths it restored or removed.
 */
export async function undoWrites(backupDir: string, force: boolean): Promise<string[]> {
  if (!existsSync(join(backupDir, JOURNAL))) return [];
  const journal = await loadJournal(backupDir);
  if (!force) {
    const changed: string[] = [];
    for (const entry of journal.files) {
      const current = await readBytes(entry.path);
      // A file node-setup created and someone removed since is already as undo would leave it
      // (k3s and RKE2 empty their certs.d folder at every start).
      if (current === undefined && !entry.existed) continue;
      if (entry.written && (current === undefined || sha256(current) !== entry.written)) changed.push(entry.path);
    }
    if (changed.length) {
      throw new NodeSetupError(
        `changed since node-setup wrote them: ${changed.join(', ')}; nothing was undone (--force restores the originals anyway)`,
      );
    }
  }
  const restored: string[] = [];
  for (const entry of [...journal.files].reverse()) {
    if (entry.existed) {
      if (!entry.backup) throw new NodeSetupError(`the journal in ${backupDir} names no backup of ${entry.path}; nothing more was undone`);
      const original = await readFile(join(backupDir, entry.backup));
      await mkdir(dirname(entry.path), { recursive: true });
      await writeAtomically(entry.path, original, entry);
    } else {
      await rm(entry.path, { force: true });
    }
    restored.push(entry.path);
  }
  for (const dir of [...journal.dirs].reverse()) {
    try {
      await rmdir(dir);
    } catch {
      // not empty: someone else put files there since
    }
  }
  await rm(backupDir, { recursive: true, force: true });
  return restored;
}

async function loadJournal(backupDir: string): Promise<Journal> {
  const text = await readIfExists(join(backupDir, JOURNAL));
  if (text === undefined) return { version: 1, files: [], dirs: [] };
  try {
    const journal = JSON.parse(text) as Journal;
    if (journal.version !== 1 || !Array.isArray(journal.files) || !Array.isArray(journal.dirs)) throw new Error('unexpected shape');
    return journal;
  } catch (error) {
    throw new NodeSetupError(
      `the backup journal ${join(backupDir, JOURNAL)} is damaged (${(error as Error).message}); nothing was changed`,
    );
  }
}

async function saveJournal(backupDir: string, journal: Journal): Promise<void> {
  await mkdir(backupDir, { recursive: true, mode: 0o700 });
  await writeAtomically(join(backupDir, JOURNAL), Buffer.from(JSON.stringify(journal, null, 2) + '\n'));
}

async function makeParents(dir: string, journal: Journal): Promise<void> {
  const missing: string[] = [];
  for (let d = dir; !existsSync(d); d = dirname(d)) missing.unshift(d);
  for (const d of missing) {
    await mkdir(d);
    journal.dirs.push(d);
  }
}

/** Write-then-rename, so a crash leaves the old file or the new one, never half of one. */
async function writeAtomically(path: string, content: Buffer, owner?: { mode?: number; uid?: number; gid?: number }): Promise<void> {
  const temp = `${path}.starling-${process.pid}.tmp`;
  await writeFile(temp, content, { mode: owner?.mode ?? 0o644 });
  if (owner?.mode !== undefined) await chmod(temp, owner.mode); // the umask must not narrow it
  if (owner?.uid !== undefined && owner.gid !== undefined) await chown(temp, owner.uid, owner.gid);
  await rename(temp, path);
}

async function readBytes(path: string): Promise<Buffer | undefined> {
  try {
    return await readFile(path);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new NodeSetupError(`cannot read ${path}: ${(error as Error).message}`);
  }
}

function sha256(data: Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}
