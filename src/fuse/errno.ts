import { constants } from 'node:os';

/** Linux errno values a FUSE operation may answer with. */
export const Errno = {
  EPERM: constants.errno.EPERM,
  ENOENT: constants.errno.ENOENT,
  EIO: constants.errno.EIO,
  EBADF: constants.errno.EBADF,
  EACCES: constants.errno.EACCES,
  EBUSY: constants.errno.EBUSY,
  EEXIST: constants.errno.EEXIST,
  ENOTDIR: constants.errno.ENOTDIR,
  EISDIR: constants.errno.EISDIR,
  EINVAL: constants.errno.EINVAL,
  EROFS: constants.errno.EROFS,
  ERANGE: constants.errno.ERANGE,
  ENOSYS: constants.errno.ENOSYS,
  ENAMETOOLONG: constants.errno.ENAMETOOLONG,
  ENODATA: constants.errno.ENODATA,
  ENOTSUP: constants.errno.ENOTSUP,
  ENOTCONN: constants.errno.ENOTCONN,
} as const;

export type ErrnoName = keyof typeof Errno;

/** Thrown by a FUSE operation to answer with a specific errno (anything else thrown becomes EIO). */
export class FuseError extends Error {
  override name = 'FuseError';
  constructor(
    readonly errno: number,
    message?: string,
  ) {
    super(message ?? `errno ${errno}`);
  }

  static of(name: ErrnoName, message?: string): FuseError {
    return new FuseError(Errno[name], message ?? name);
  }
}
