// Module entry: exports the Session class and a detached unmount for stale mounts.
#include <napi.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "session.h"

namespace starling_fuse {

// umount2() on a libuv worker: a stale FUSE mount must never be touched from the JS thread.
class UmountWorker : public Napi::AsyncWorker {
 public:
  UmountWorker(Napi::Env env, std::string path, int flags)
      : Napi::AsyncWorker(env), deferred_(Napi::Promise::Deferred::New(env)), path_(std::move(path)), flags_(flags) {}
  Napi::Promise Promise() { return deferred_.Promise(); }
  void Execute() override { err_ = umount2(path_.c_str(), flags_) == 0 ? 0 : errno; }
  void OnOK() override { deferred_.Resolve(Napi::Number::New(Env(), err_)); }

 private:
  Napi::Promise::Deferred deferred_;
  std::string path_;
  int flags_;
  int err_ = 0;
};

// umount(path, lazy) → Promise<errno> (0 on success).
Napi::Value Umount(const Napi::CallbackInfo& info) {
  std::string path = info[0].As<Napi::String>().Utf8Value();
  bool lazy = info[1].ToBoolean().Value();
  auto* worker = new UmountWorker(info.Env(), path, lazy ? MNT_DETACH : 0);
  worker->Queue();
  return worker->Promise();
}

}  // namespace starling_fuse

static Napi::Object InitModule(Napi::Env env, Napi::Object exports) {
  exports.Set("Session", starling_fuse::Session::Define(env));
  exports.Set("umount", Napi::Function::New(env, starling_fuse::Umount));
  exports.Set("fuseVersion", Napi::Number::New(env, fuse_version()));
  return exports;
}

NODE_API_MODULE(starling_fuse, InitModule)
