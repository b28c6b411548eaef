// Conversions between JS values and libfuse structures.
#pragma once

#include <napi.h>
#include <sys/stat.h>

namespace starling_fuse {

// {ino, mode, nlink, uid, gid, rdev, size, blocks, blksize, mtimeSec, mtimeNsec} → struct stat
// (atime and ctime are the mtime: layers are immutable).
struct stat ToStat(const Napi::Object& attr);
double NumberField(const Napi::Object& obj, const char* name, double fallback = 0);

}  // namespace starling_fuse
