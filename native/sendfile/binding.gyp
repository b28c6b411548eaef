# sendfile(2) for the peer's cache hits: file bytes go from the page cache to the socket without
# passing through JavaScript. Each call runs on its own thread (waiting for a slow client must
# not hold a libuv pool thread that file I/O needs). Built offline like native/fuse.
{
  "targets": [
    {
      "target_name": "starling_sendfile",
      "sources": ["src/sendfile.cc"],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions"],
      "cflags_cc": ["-std=c++17", "-fexceptions", "-Wall", "-Wextra", "-Wno-unused-parameter"]
    }
  ]
}
