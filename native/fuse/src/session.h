// One FUSE mount: a libfuse low-level session whose loop runs on its own native thread.
// Requests travel to JavaScript through a threadsafe function; JavaScript answers later by
// calling the reply* methods with the request id it was given (fuse_reply_* is thread-safe,
// so replies go straight from the JS thread to the kernel).
#pragma once

#include <fuse_lowlevel.h>
#include <napi.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <unordered_map>

namespace starling_fuse {

// Operation codes shared with src/fuse/native.ts (keep in sync).
enum class Op : int {
  Lookup = 1, Forget = 2, Getattr = 3, Readlink = 4, Open = 5, Read = 6, Release = 7,
  Opendir = 8, Readdir = 9, Readdirplus = 10, Releasedir = 11, Statfs = 12, Getxattr = 13, Listxattr = 14,
};

// A request read by the loop thread, on its way to the JS thread.
struct Request {
  Op op;
  fuse_req_t req;  // nullptr for forget (answered natively at once)
  fuse_ino_t ino;
  uint64_t fh = 0;
  uint64_t size = 0;
  int64_t off = 0;
  int flags = 0;
  uint64_t nlookup = 0;
  std::string name;
};

// A request JS has been told about and has not answered yet.
struct Pending {
  fuse_req_t req;
  Op op;
  uint64_t size;  // the kernel's buffer size (read, readdir, xattrs)
};

struct MountSettings {
  unsigned maxReadahead = 0;  // 0: kernel default
  unsigned maxBackground = 0;  // 0: libfuse default
  unsigned congestionThreshold = 0;
};

class Session;
void CallJs(Napi::Env env, Napi::Function dispatch, Session* session, Request* request);
using Tsfn = Napi::TypedThreadSafeFunction<Session, Request, CallJs>;

class Session : public Napi::ObjectWrap<Session> {
 public:
  static Napi::Function Define(Napi::Env env);
  explicit Session(const Napi::CallbackInfo& info);
  ~Session() override;

  // Called on the loop thread by the low-level callbacks.
  void Post(Request* request);
  const MountSettings& settings() const { return settings_; }

  // Called on the JS thread.
  void Deliver(Napi::Env env, Napi::Function dispatch, Request* request);
  void Finish(Napi::Env env);

  // The worker threads of mount() and unmount().
  int MountNow();  // returns 0 or an errno
  int UnmountNow(bool lazy);

 private:
  Napi::Value Mount(const Napi::CallbackInfo& info);
  Napi::Value Unmount(const Napi::CallbackInfo& info);
  Napi::Value ReplyErr(const Napi::CallbackInfo& info);
  Napi::Value ReplyEntry(const Napi::CallbackInfo& info);
  Napi::Value ReplyAttr(const Napi::CallbackInfo& info);
  Napi::Value ReplyReadlink(const Napi::CallbackInfo& info);
  Napi::Value ReplyOpen(const Napi::CallbackInfo& info);
  Napi::Value ReplyBuf(const Napi::CallbackInfo& info);
  Napi::Value ReplyFds(const Napi::CallbackInfo& info);
  Napi::Value ReplyDir(const Napi::CallbackInfo& info);
  Napi::Value ReplyStatfs(const Napi::CallbackInfo& info);
  Napi::Value ReplyXattr(const Napi::CallbackInfo& info);
  Napi::Value PendingCount(const Napi::CallbackInfo& info);

  // Takes a pending request out of the table; false if the id is unknown (already answered,
  // or the session ended and answered it with an error).
  bool Take(const Napi::CallbackInfo& info, Pending* out);
  void Loop();

  std::string mountpoint_;
  std::string options_;  // the -o string for fuse_session_new
  MountSettings settings_;
  fuse_session* se_ = nullptr;
  std::thread loop_;
  int loopResult_ = 0;
  std::atomic<bool> unmountRequested_{false};
  Tsfn tsfn_;
  Napi::FunctionReference onExit_;
  std::unordered_map<double, Pending> pending_;  // JS thread only
  double nextId_ = 0;
};

}  // namespace starling_fuse
