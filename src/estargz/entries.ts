import { createWriteStream } from 'node:fs';
import { once } from 'node:events';
import { ByteReader } from './byte-reader.js';
import { EstargzError } from './errors.js';
import { cleanPrioritizedName, normalizeEntryName, parentName, shorten } from './names.js';
import { type RangeSource, readRangePieces } from './source.js';
import { NO_PREFETCH_LANDMARK, PREFETCH_LANDMARK, LANDMARK_CONTENTS, TOC_TAR_NAME } from './toc.js';
import { paddingFor, parseRawHeader, readTarEntry, ustarFileHeader, TYPE_LINK, type TarHeader } from './tar.js';

/** One member of the layer in the order it will be written, with a way to read its data once. */
export interface LayerEntry {
  header: TarHeader;
  raw: Buffer;
  data: AsyncIterable<Buffer> | Iterable<Buffer>;
}

/** Entries Go's builder drops from its input: an old TOC and old landmarks. */
function isReservedName(name: string): boolean {
  return name === TOC_TAR_NAME || name === PREFETCH_LANDMARK || name === NO_PREFETCH_LANDMARK;
}

function safeName(header: TarHeader): string {
  try {
    return normalizeEntryName(header.name);
  } catch (error) {
    throw new EstargzError('UNSAFE_NAME', `input tar: ${(error as Error).message}`);
  }
}

export function landmarkEntry(prioritized: boolean): LayerEntry {
  const name = prioritized ? PREFETCH_LANDMARK : NO_PREFETCH_LANDMARK;
  const raw = ustarFileHeader(name, 1);
  const header: TarHeader = {
    name,
    linkName: '',
    typeflag: '0',
    size: 1,
    mode: 0,
    uid: 0,
    gid: 0,
    uname: '',
    gname: '',
    mtime: { seconds: 0, nanos: 0 },
    devMajor: 0,
    devMinor: 0,
    xattrs: {},
  };
  return { header, raw, data: [Buffer.from([LANDMARK_CONTENTS])] };
}

/**
 * Entries straight from the input stream, in input order, after the .no.prefetch.landmark.
 * Nothing is reordered, so a name seen twice cannot be resolved the way Go does (later wins
 * and takes the later position) and is refused; spooling handles that case.
 */
export async function* streamedEntries(tar: AsyncIterable<Buffer>): AsyncGenerator<LayerEntry> {
  yield landmarkEntry(false);
  const reader = ByteReader.from(tar);
  const seen = new Set<string>();
  for (;;) {
    const entry = await readTarEntry(reader);
    if (!entry) break;
    const name = safeName(entry.header);
    const size = entry.header.size;
    if (isReservedName(name)) {
      await reader.skip(size + paddingFor(size), 'skipped entry');
      continue;
    }
    if (seen.has(name)) {
      throw new EstargzError(
        'DUPLICATE',
        `input tar holds "${shorten(name)}" more than once; build with spooling (--spool) to keep the last one, as tar extraction would`,
      );
    }
    seen.add(name);
    let consumed = 0;
    const data = (async function* () {
      for await (const piece of reader.readPieces(size, `data of "${shorten(name)}"`)) {
        consumed += piece.length;
        yield piece;
      }
    })();
    yield { header: entry.header, raw: entry.raw, data };
    // The consumer may refuse the entry without reading its data; keep the stream aligned.
    if (consumed < size) await reader.skip(size - consumed, 'unread data');
    await reader.skip(paddingFor(size), 'padding');
  }
  await reader.drain(); // trailing zero blocks and anything after the end marker
}

/** Where one member lives in the spooled tar file. */
interface SpooledRecord {
  name: string;
  typeflag: string;
  linkName: string;
  headerOffset: number;
  rawLength: number;
  dataOffset: number;
  size: number;
  index: number;
}

/**
 * Copies the tar to `spoolPath` while indexing it, so entries can then be emitted in any order
 * (prioritized files first) with memory bounded by the index, not the layer. Duplicates are
 * resolved as Go's importTar does: the last occurrence wins and takes the last position.
 */
export async function spoolTar(tar: AsyncIterable<Buffer>, spoolPath: string): Promise<SpooledRecord[]> {
  const file = createWriteStream(spoolPath);
  const failed = once(file, 'error').then(([error]) => {
    throw error;
  });
  failed.catch(() => undefined);
  async function* teeToFile(): AsyncGenerator<Buffer> {
    for await (const piece of tar) {
      if (!file.write(piece)) await Promise.race([once(file, 'drain'), failed]);
      yield piece;
    }
  }
  const reader = ByteReader.from(teeToFile());
  const byName = new Map<string, SpooledRecord>();
  let index = 0;
  try {
    for (;;) {
      const entry = await readTarEntry(reader);
      if (!entry) break;
      const { header } = entry;
      const name = safeName(header);
      await reader.skip(header.size + paddingFor(header.size), `data of "${shorten(name)}"`);
      if (isReservedName(name)) continue;
      byName.delete(name); // re-inserting moves it to the end, like Go's remove-then-add
      byName.set(name, {
        name,
        typeflag: header.typeflag,
        linkName: header.linkName,
        headerOffset: entry.headerOffset,
        rawLength: entry.raw.length,
        dataOffset: entry.dataOffset,
        size: header.size,
        index: index++,
      });
    }
    await reader.drain();
  } finally {
    file.end();
    await Promise.race([once(file, 'close'), failed]);
  }
  return [...byName.values()];
}

/**
 * Go's sortEntries: each prioritized path is moved to the front together with its parent
 * directories (first) and, for hardlinks, the link target. Paths are cleaned leniently as in
 * Go ("/a", "./a" mean "a"). A missing prioritized file is an error (or, given `missing`, is
 * recorded there); a missing parent directory
 * is not (Go would fail, but tars often omit parent entries and readers create them implicitly).
 */
export function orderSpooled(
  records: SpooledRecord[],
  prioritized: string[],
  missing?: string[],
): { front: SpooledRecord[]; rest: SpooledRecord[] } {
  const remaining = new Map(records.map((r) => [r.name, r]));
  const moved = new Set<string>();
  const front: SpooledRecord[] = [];
  const visiting = new Set<string>();
  const move = (name: string, required: boolean): void => {
    if (name === '') {
      const root = remaining.get('');
      if (root) {
        front.push(root);
        remaining.delete('');
        moved.add('');
      }
      return;
    }
    if (!remaining.has(name) && !moved.has(name)) {
      if (required) throw new EstargzError('NOT_FOUND', `prioritized file "${shorten(name)}" is not in the layer`);
      return;
    }
    if (visiting.has(name)) return; // hardlink cycle
    visiting.add(name);
    move(parentName(name), false);
    const record = remaining.get(name);
    if (record?.typeflag === TYPE_LINK) move(cleanPrioritizedName(record.linkName), true);
    if (record && remaining.has(name)) {
      front.push(record);
      remaining.delete(name);
      moved.add(name);
    }
    visiting.delete(name);
  };
  for (const path of prioritized) {
    const name = cleanPrioritizedName(path);
    if (missing && !remaining.has(name) && !moved.has(name)) missing.push(path);
    else move(name, true);
  }
  return { front, rest: [...remaining.values()] };
}

/** Reads a spooled record's header and data back from the spool file. */
export async function spooledEntry(spool: RangeSource, record: SpooledRecord): Promise<LayerEntry> {
  const raw = await spool.read(record.headerOffset, record.rawLength);
  const header = await parseRawHeader(raw);
  return { header, raw, data: readRangePieces(spool, record.dataOffset, record.size, 1 << 20) };
}
