#include "convert.h"

#include <cstring>

namespace starling_fuse {

double NumberField(const Napi::Object& obj, const char* name, double fallback) {
  Napi::Value v = obj.Get(name);
  return v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : fallback;
}

struct stat ToStat(const Napi::Object& attr) {
  struct stat st;
  std::memset(&st, 0, sizeof st);
  st.st_ino = static_cast<ino_t>(NumberField(attr, "ino"));
  st.st_mode = static_cast<mode_t>(NumberField(attr, "mode"));
  st.st_nlink = static_cast<nlink_t>(NumberField(attr, "nlink", 1));
  st.st_uid = static_cast<uid_t>(NumberField(attr, "uid"));
  st.st_gid = static_cast<gid_t>(NumberField(attr, "gid"));
  st.st_rdev = static_cast<dev_t>(NumberField(attr, "rdev"));
  st.st_size = static_cast<off_t>(NumberField(attr, "size"));
  st.st_blksize = static_cast<blksize_t>(NumberField(attr, "blksize", 4096));
  st.st_blocks = static_cast<blkcnt_t>(NumberField(attr, "blocks", (st.st_size + 511) / 512));
  st.st_mtim.tv_sec = static_cast<time_t>(NumberField(attr, "mtimeSec"));
  st.st_mtim.tv_nsec = static_cast<long>(NumberField(attr, "mtimeNsec"));
  st.st_atim = st.st_mtim;
  st.st_ctim = st.st_mtim;
  return st;
}

}  // namespace starling_fuse
