# The FUSE addon: libfuse3's low-level API driven on a native thread, every request
# forwarded to JavaScript through a threadsafe function and answered asynchronously.
# Built offline by the node-gyp bundled with npm (npm's global config sets nodedir).
{
  "targets": [
    {
      "target_name": "starling_fuse",
      "sources": ["src/addon.cc", "src/session.cc", "src/ops.cc", "src/convert.cc"],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS", "FUSE_USE_VERSION=34"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions"],
      "cflags_cc": ["-std=c++17", "-fexceptions", "-Wall", "-Wextra", "-Wno-unused-parameter", "<!@(pkg-config --cflags fuse3)"],
      "libraries": ["<!@(pkg-config --libs fuse3)"]
    }
  ]
}
