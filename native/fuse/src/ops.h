#pragma once
#include <fuse_lowlevel.h>

namespace starling_fuse {
// The libfuse low-level callbacks: each packs its arguments into a Request for JS.
const fuse_lowlevel_ops* LowLevelOps();
}
