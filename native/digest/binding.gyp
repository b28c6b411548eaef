# Hashing on the libuv thread pool: the whole-blob digest and the piece checks of a peer run here
# instead of on the JavaScript thread, which they held for ~1.6 s per GB. SHA-256/512 go through
# the OpenSSL that Node itself carries (its symbols are exported to addons: nothing to link);
# CRC-32C uses the CPU's instruction where there is one. Built offline like native/fuse.
{
  "targets": [
    {
      "target_name": "starling_digest",
      "sources": ["src/digest.cc"],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions"],
      "cflags_cc": ["-std=c++17", "-O3", "-fexceptions", "-Wall", "-Wextra", "-Wno-unused-parameter"]
    }
  ]
}
