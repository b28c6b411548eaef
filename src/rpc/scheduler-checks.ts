// What the scheduler accepts from a caller, checked at its gRPC door before the engine sees it:
// even a caller holding the cluster token cannot make it do unbounded work (a task of 10^9 pieces
// of one byte blocked its event loop for 16 s) or keep unbounded state. Each check names what is
// wrong. The engine itself (scheduler/scheduling.ts) trusts its input: the simulator drives it too.
import { isIP } from 'node:net';
import { parseBlobUrl } from '../oci/blob-url.js';
import { parseDigest } from '../oci/digest.js';
import { pieceSizeFor } from '../storage/piece-plan.js';
import type { HostInfo, PeerPacket, RegisterPeer } from './scheduler-api.js';

/** The largest blob a task may be: 16 TiB (262,144 pieces of 64 MiB). */
export const MAX_TASK_BYTES = 2 ** 44;
const MAX_ID_LENGTH = 256;
const MAX_LABELS = 64;
const MAX_LABEL_LENGTH = 256;
const MAX_URL_LENGTH = 2048;
const MAX_MESSAGE_LENGTH = 1024;
const MAX_BLOCKLIST = 1024;
const MAX_UPLOAD_SLOTS = 4096;

export class SchedulerInputError extends Error {
  override name = 'SchedulerInputError';
}

function fail(message: string): never {
  throw new SchedulerInputError(message);
}

function checkId(value: unknown, what: string): string {
  if (typeof value !== 'string' || value.length === 0) fail(`${what} is missing`);
  if (value.length > MAX_ID_LENGTH) fail(`${what} is longer than ${MAX_ID_LENGTH} characters`);
  return value;
}

function checkCount(value: unknown, what: string, max: number): void {
  if (!Number.isSafeInteger(value) || (value as number) < 0 || (value as number) > max) fail(`${what} must be an integer from 0 to ${max}`);
}

export function checkHost(info: HostInfo | undefined): HostInfo {
  if (!info) fail('host is missing');
  checkId(info.id, 'host id');
  if (typeof info.hostname !== 'string' || info.hostname.length > MAX_ID_LENGTH)
    fail(`host name must be at most ${MAX_ID_LENGTH} characters`);
  if (!isIP(info.ip)) fail(`host ip "${String(info.ip).slice(0, 64)}" is not an IP address`);
  if (!Number.isInteger(info.uploadPort) || info.uploadPort < 1 || info.uploadPort > 65535)
    fail('host upload port must be from 1 to 65535');
  const labels = Object.entries(info.labels ?? {});
  if (labels.length > MAX_LABELS) fail(`host has more than ${MAX_LABELS} labels`);
  for (const [key, value] of labels) {
    if (key.length > MAX_LABEL_LENGTH || value.length > MAX_LABEL_LENGTH)
      fail(`host label "${key.slice(0, 64)}" is longer than ${MAX_LABEL_LENGTH} characters`);
  }
  checkCount(info.uploadSlots, 'upload slots', MAX_UPLOAD_SLOTS);
  checkCount(info.uploadInUse, 'upload slots in use', MAX_UPLOAD_SLOTS);
  checkCount(info.uploadBandwidth, 'upload bandwidth', Number.MAX_SAFE_INTEGER);
  return info;
}

export function checkRegister(register: RegisterPeer | undefined): RegisterPeer {
  if (!register) fail('register is missing');
  checkId(register.peerId, 'peer id');
  checkId(register.hostId, 'host id');
  let taskId: string;
  try {
    taskId = parseDigest(String(register.taskId ?? '')).value;
  } catch (error) {
    fail(`task id: ${(error as Error).message}`);
  }
  const size = register.contentLength;
  if (!Number.isSafeInteger(size) || size < 0 || size > MAX_TASK_BYTES)
    fail(`content length must be an integer from 0 to ${MAX_TASK_BYTES}`);
  // Peers cut every blob by the same plan: any other piece size is not a peer's.
  if (register.pieceSize !== pieceSizeFor(size))
    fail(`piece size ${register.pieceSize} is not the ${pieceSizeFor(size)} a blob of ${size} bytes is cut into`);
  const pieceCount = Math.max(1, Math.ceil(size / register.pieceSize));
  const held = register.heldPieces ?? [];
  if (held.length > pieceCount) fail(`held pieces list ${held.length} entries for a task of ${pieceCount} pieces`);
  for (const index of held)
    if (!Number.isInteger(index) || index < 0 || index >= pieceCount) fail(`held piece ${index} is not a piece of this task`);
  const origin = register.origin;
  if (origin) {
    if (Object.keys(origin.headers ?? {}).length > 0)
      fail('origin headers are refused: registry credentials must not be sent to the scheduler');
    if (origin.url) {
      if (origin.url.length > MAX_URL_LENGTH) fail(`origin url is longer than ${MAX_URL_LENGTH} characters`);
      let named: string;
      try {
        named = parseBlobUrl(origin.url).digest;
      } catch (error) {
        fail(`origin url: ${(error as Error).message}`);
      }
      if (named !== taskId) fail(`origin url names blob ${named}, not the task ${taskId}`);
    }
  }
  return register;
}

/** Checks a packet after the register (indexes are checked against the task by the engine). */
export function checkPeerPacket(packet: PeerPacket): PeerPacket {
  switch (packet.packet) {
    case 'pieceStarted':
      if (packet.pieceStarted.parentId) checkId(packet.pieceStarted.parentId, 'piece parent id');
      break;
    case 'pieceFinished':
      if (typeof packet.pieceFinished.digest === 'string' && packet.pieceFinished.digest.length > 150) fail('piece digest is too long');
      break;
    case 'pieceFailed':
      if ((packet.pieceFailed.message ?? '').length > MAX_MESSAGE_LENGTH)
        packet.pieceFailed.message = packet.pieceFailed.message.slice(0, MAX_MESSAGE_LENGTH);
      break;
    case 'reschedule':
      if ((packet.reschedule.blocklist ?? []).length > MAX_BLOCKLIST) fail(`blocklist has more than ${MAX_BLOCKLIST} entries`);
      break;
    case 'downloadFailed':
      if ((packet.downloadFailed.message ?? '').length > MAX_MESSAGE_LENGTH)
        packet.downloadFailed.message = packet.downloadFailed.message.slice(0, MAX_MESSAGE_LENGTH);
      break;
    default:
      break;
  }
  return packet;
}
