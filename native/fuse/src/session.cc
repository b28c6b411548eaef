#include "session.h"

#include <sys/mount.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "convert.h"
#include "ops.h"

namespace starling_fuse {

// ---------------------------------------------------------------- construction

Napi::Function Session::Define(Napi::Env env) {
  return DefineClass(env, "Session",
                     {
                         InstanceMethod("mount", &Session::Mount),
                         InstanceMethod("unmount", &Session::Unmount),
                         InstanceMethod("replyErr", &Session::ReplyErr),
                         InstanceMethod("replyEntry", &Session::ReplyEntry),
                         InstanceMethod("replyAttr", &Session::ReplyAttr),
                         InstanceMethod("replyReadlink", &Session::ReplyReadlink),
                         InstanceMethod("replyOpen", &Session::ReplyOpen),
                         InstanceMethod("replyBuf", &Session::ReplyBuf),
                         InstanceMethod("replyFds", &Session::ReplyFds),
                         InstanceMethod("replyDir", &Session::ReplyDir),
                         InstanceMethod("replyStatfs", &Session::ReplyStatfs),
                         InstanceMethod("replyXattr", &Session::ReplyXattr),
                         InstanceMethod("pendingCount", &Session::PendingCount),
                     });
}

// new Session(mountpoint, optionString, {maxReadahead, maxBackground, congestionThreshold}, dispatch, onExit)
Session::Session(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Session>(info) {
  mountpoint_ = info[0].As<Napi::String>().Utf8Value();
  options_ = info[1].As<Napi::String>().Utf8Value();
  Napi::Object s = info[2].As<Napi::Object>();
  settings_.maxReadahead = static_cast<unsigned>(NumberField(s, "maxReadahead"));
  settings_.maxBackground = static_cast<unsigned>(NumberField(s, "maxBackground"));
  settings_.congestionThreshold = static_cast<unsigned>(NumberField(s, "congestionThreshold"));
  Napi::Function dispatch = info[3].As<Napi::Function>();
  onExit_ = Napi::Persistent(info[4].As<Napi::Function>());

  // fuse_session_new parses the mount options (ro, allow_other, max_read, ...) and rejects unknown ones.
  std::vector<std::string> argv = {"starling-fuse", "-o", options_};
  std::vector<char*> ptrs;
  for (auto& a : argv) ptrs.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(ptrs.size()), ptrs.data());
  se_ = fuse_session_new(&args, LowLevelOps(), sizeof(fuse_lowlevel_ops), this);
  fuse_opt_free_args(&args);
  if (!se_) {
    Napi::Error::New(info.Env(), "fuse_session_new failed (bad mount options? \"" + options_ + "\")").ThrowAsJavaScriptException();
    return;
  }
  // The threadsafe function exists from the start so its finalizer is the single place where a
  // session ends, whether it was ever mounted or not.
  tsfn_ = Tsfn::New(info.Env(), dispatch, "starling-fuse", 0, 1, this,
                    [](Napi::Env env, void*, Session* self) { self->Finish(env); });
  tsfn_.Unref(info.Env());  // only a live mount keeps the process alive (see Mount)
  Ref();                    // released in Finish
}

Session::~Session() {
  if (loop_.joinable()) loop_.detach();  // cannot happen after Finish; never std::terminate
}

// ---------------------------------------------------------------- mount and the loop thread

int Session::MountNow() {
  if (fuse_session_mount(se_, mountpoint_.c_str()) != 0) return errno ? errno : EIO;
  return 0;
}

namespace {

class MountWorker : public Napi::AsyncWorker {
 public:
  MountWorker(Napi::Env env, Session* s, std::function<void(Napi::Env, int)> done)
      : Napi::AsyncWorker(env), session_(s), done_(std::move(done)) {}
  void Execute() override { err_ = session_->MountNow(); }
  void OnOK() override { done_(Env(), err_); }

 private:
  Session* session_;
  std::function<void(Napi::Env, int)> done_;
  int err_ = 0;
};

class UnmountWorker : public Napi::AsyncWorker {
 public:
  UnmountWorker(Napi::Env env, Session* s, bool lazy)
      : Napi::AsyncWorker(env), deferred_(Napi::Promise::Deferred::New(env)), session_(s), lazy_(lazy) {}
  Napi::Promise Promise() { return deferred_.Promise(); }
  void Execute() override { err_ = session_->UnmountNow(lazy_); }
  void OnOK() override { deferred_.Resolve(Napi::Number::New(Env(), err_)); }

 private:
  Napi::Promise::Deferred deferred_;
  Session* session_;
  bool lazy_;
  int err_ = 0;
};

}  // namespace

// mount() → Promise<void>; rejects with the errno of a failed mount.
Napi::Value Session::Mount(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto deferred = Napi::Promise::Deferred::New(env);
  if (!se_ || loop_.joinable()) {
    deferred.Reject(Napi::Error::New(env, "session already mounted or closed").Value());
    return deferred.Promise();
  }
  // fuse_session_mount stats the mountpoint: done off the JS thread in case it is a FUSE mount itself.
  auto* worker = new MountWorker(env, this, [this, deferred](Napi::Env env, int err) {
    if (err != 0) {
      Napi::Error e = Napi::Error::New(env, std::string("mount ") + mountpoint_ + ": " + std::strerror(err));
      e.Set("errno", Napi::Number::New(env, err));
      deferred.Reject(e.Value());
      tsfn_.Release();  // nothing to serve: end the session (Finish runs)
      return;
    }
    tsfn_.Ref(env);
    loop_ = std::thread([this] { Loop(); });
    deferred.Resolve(env.Undefined());
  });
  worker->Queue();
  return deferred.Promise();
}

void Session::Loop() {
  // Single-threaded is enough: no callback blocks, answers come later from the JS thread.
  loopResult_ = fuse_session_loop(se_);
  tsfn_.Release();  // the last reference: Finish runs on the JS thread once the queue is drained
}

void Session::Post(Request* request) {
  if (tsfn_.NonBlockingCall(request) != napi_ok) {
    if (request->req) fuse_reply_err(request->req, EIO);
    delete request;
  }
}

void CallJs(Napi::Env env, Napi::Function dispatch, Session* session, Request* request) {
  session->Deliver(env, dispatch, request);
}

void Session::Deliver(Napi::Env env, Napi::Function dispatch, Request* r) {
  std::unique_ptr<Request> owned(r);
  if (env == nullptr) {  // the environment is shutting down
    if (r->req) fuse_reply_err(r->req, EIO);
    return;
  }
  double id = 0;
  if (r->req) {
    id = ++nextId_;
    pending_[id] = Pending{r->req, r->op, r->size};
  }
  double last = r->op == Op::Forget ? static_cast<double>(r->nlookup) : static_cast<double>(r->flags);
  try {
    dispatch.Call({Napi::Number::New(env, static_cast<int>(r->op)), Napi::Number::New(env, id),
                   Napi::Number::New(env, static_cast<double>(r->ino)), Napi::Number::New(env, static_cast<double>(r->size)),
                   Napi::Number::New(env, static_cast<double>(r->off)), Napi::Number::New(env, static_cast<double>(r->fh)),
                   Napi::Number::New(env, last), Napi::String::New(env, r->name)});
  } catch (const Napi::Error&) {
    // The JS dispatcher catches its own errors; this is a last resort so the kernel gets an answer.
    auto it = pending_.find(id);
    if (it != pending_.end()) {
      fuse_reply_err(it->second.req, EIO);
      pending_.erase(it);
    }
  }
}

// The threadsafe function's finalizer: the loop has ended (or never started) and every queued
// request has been delivered. Answer what JS still owes, close the channel, tell JS.
void Session::Finish(Napi::Env env) {
  if (loop_.joinable()) loop_.join();
  for (auto& [id, p] : pending_) fuse_reply_err(p.req, EIO);
  pending_.clear();
  bool requested = unmountRequested_.load();
  if (se_) {
    // If the channel is still up (the loop stopped on fuse_session_exit), this detaches the mount;
    // if the kernel already ended it, it only closes the fd.
    fuse_session_unmount(se_);
    fuse_session_destroy(se_);
    se_ = nullptr;
  }
  Napi::HandleScope scope(env);
  try {
    onExit_.Call({Napi::Number::New(env, loopResult_), Napi::Boolean::New(env, requested)});
  } catch (const Napi::Error&) {
  }
  onExit_.Reset();
  Unref();
}

// ---------------------------------------------------------------- unmount

int Session::UnmountNow(bool lazy) {
  // Set first: the loop may end (and Finish report the exit) before umount2 even returns.
  unmountRequested_ = true;
  if (umount2(mountpoint_.c_str(), lazy ? MNT_DETACH : 0) != 0) {
    int err = errno;
    if (err != EINVAL) {  // EBUSY: still in use, the mount keeps being served
      unmountRequested_ = false;
      return err;
    }
    // EINVAL: not a mount point any more (unmounted behind our back); stop the loop anyway.
  }
  // No fuse_session_exit here: the kernel ends the connection when the superblock goes (at once,
  // or for a lazy detach when the last user leaves) and the loop then reads ENODEV and returns.
  // Stopping the loop earlier would strand the open files a lazy detach must keep serving, and
  // se_ may already be destroyed by Finish on the JS thread by the time umount2 returns.
  return 0;
}

// unmount(lazy) → Promise<errno>: 0 once the mount is gone from the namespace.
Napi::Value Session::Unmount(const Napi::CallbackInfo& info) {
  auto* worker = new UnmountWorker(info.Env(), this, info[0].ToBoolean().Value());
  worker->Queue();
  return worker->Promise();
}

// ---------------------------------------------------------------- replies (JS thread)

bool Session::Take(const Napi::CallbackInfo& info, Pending* out) {
  auto it = pending_.find(info[0].As<Napi::Number>().DoubleValue());
  if (it == pending_.end()) return false;
  *out = it->second;
  pending_.erase(it);
  return true;
}

Napi::Value Session::PendingCount(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(pending_.size()));
}

Napi::Value Session::ReplyErr(const Napi::CallbackInfo& info) {
  Pending p;
  if (!Take(info, &p)) return Napi::Boolean::New(info.Env(), false);
  fuse_reply_err(p.req, info[1].As<Napi::Number>().Int32Value());
  return Napi::Boolean::New(info.Env(), true);
}

static fuse_entry_param ToEntry(const Napi::Object& attr, double entryTimeout, double attrTimeout) {
  fuse_entry_param e;
  std::memset(&e, 0, sizeof e);
  e.attr = ToStat(attr);
  e.ino = e.attr.st_ino;
  e.generation = 1;
  e.entry_timeout = entryTimeout;
  e.attr_timeout = attrTimeout;
  return e;
}

// replyEntry(id, attr, entryTimeout, attrTimeout)
Napi::Value Session::ReplyEntry(const Napi::CallbackInfo& info) {
  Pending p;
  if (!Take(info, &p)) return Napi::Boolean::New(info.Env(), false);
  fuse_entry_param e = ToEntry(info[1].As<Napi::Object>(), info[2].As<Napi::Number>().DoubleValue(),
                               info[3].As<Napi::Number>().DoubleValue());
  fuse_reply_entry(p.req, &e);
  return Napi::Boolean::New(info.Env(), true);
}

// replyAttr(id, attr, attrTimeout)
Napi::Value Session::ReplyAttr(const Napi::CallbackInfo& info) {
  Pending p;
  if (!Take(info, &p)) return Napi::Boolean::New(info.Env(), false);
  struct stat st = ToStat(info[1].As<Napi::Object>());
  fuse_reply_attr(p.req, &st, info[2].As<Napi::Number>().DoubleValue());
  return Napi::Boolean::New(info.Env(), true);
}

// replyReadlink(id, target)
Napi::Value Session::ReplyReadlink(const Napi::CallbackInfo& info) {
  Pending p;
  if (!Take(info, &p)) return Napi::Boolean::New(info.Env(), false);
  fuse_reply_readlink(p.req, info[1].As<Napi::String>().Utf8Value().c_str());
  return Napi::Boolean::New(info.Env(), true);
}

// replyOpen(id, fh, directIo, keepCache)
Napi::Value Session::ReplyOpen(const Napi::CallbackInfo& info) {
  Pending p;
  if (!Take(info, &p)) return Napi::Boolean::New(info.Env(), false);
  fuse_file_info fi;
  std::memset(&fi, 0, sizeof fi);
  fi.fh = static_cast<uint64_t>(info[1].As<Napi::Number>().DoubleValue());
  fi.direct_io = info[2].ToBoolean().Value() ? 1 : 0;
  fi.keep_cache = info[3].ToBoolean().Value() ? 1 : 0;
  if (p.op == Op::Opendir) fi.cache_readdir = fi.keep_cache;
  fuse_reply_open(p.req, &fi);
  return Napi::Boolean::New(info.Env(), true);
}

// replyBuf(id, buffer): file data (never more than the kernel asked for).
Napi::Value Session::ReplyBuf(const Napi::CallbackInfo& info) {
  Pending p;
  if (!Take(info, &p)) return Napi::Boolean::New(info.Env(), false);
  auto buf = info[1].As<Napi::Buffer<char>>();
  fuse_reply_buf(p.req, buf.Data(), std::min<size_t>(buf.Length(), p.size));
  return Napi::Boolean::New(info.Env(), true);
}

// replyFds(id, [fd, offset, length, fd, offset, length, ...]): file data taken by libfuse from
// open files (the chunk cache) rather than from a JavaScript buffer, so a cached read costs no copy
// through JS and no garbage. The descriptors must stay open until this returns; never more than
// the kernel asked for is sent. A failed read of a descriptor makes libfuse answer with its errno.
Napi::Value Session::ReplyFds(const Napi::CallbackInfo& info) {
  Pending p;
  if (!Take(info, &p)) return Napi::Boolean::New(info.Env(), false);
  Napi::Array flat = info[1].As<Napi::Array>();
  size_t count = flat.Length() / 3;
  if (count == 0) {
    fuse_reply_buf(p.req, nullptr, 0);
    return Napi::Boolean::New(info.Env(), true);
  }
  std::vector<char> storage(sizeof(fuse_bufvec) + (count - 1) * sizeof(fuse_buf), 0);
  auto* bufv = reinterpret_cast<fuse_bufvec*>(storage.data());
  bufv->count = count;
  size_t budget = p.size;
  size_t used = 0;
  for (size_t i = 0; i < count && budget > 0; i++) {
    fuse_buf& b = bufv->buf[used++];
    b.fd = flat.Get(static_cast<uint32_t>(3 * i)).As<Napi::Number>().Int32Value();
    b.pos = static_cast<off_t>(flat.Get(static_cast<uint32_t>(3 * i + 1)).As<Napi::Number>().DoubleValue());
    b.size = std::min<size_t>(budget, static_cast<size_t>(flat.Get(static_cast<uint32_t>(3 * i + 2)).As<Napi::Number>().DoubleValue()));
    b.flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
    budget -= b.size;
  }
  bufv->count = used;
  fuse_reply_data(p.req, bufv, FUSE_BUF_SPLICE_MOVE);
  return Napi::Boolean::New(info.Env(), true);
}

// replyDir(id, entries[{name, off, attr}], entryTimeout, attrTimeout): packs as many entries as
// fit the kernel's buffer; `off` of an entry is the offset of the one after it.
Napi::Value Session::ReplyDir(const Napi::CallbackInfo& info) {
  Pending p;
  if (!Take(info, &p)) return Napi::Boolean::New(info.Env(), false);
  Napi::Array entries = info[1].As<Napi::Array>();
  double entryTimeout = info[2].As<Napi::Number>().DoubleValue();
  double attrTimeout = info[3].As<Napi::Number>().DoubleValue();
  bool plus = p.op == Op::Readdirplus;
  std::vector<char> buf(p.size);
  size_t used = 0;
  for (uint32_t i = 0; i < entries.Length(); i++) {
    Napi::Object ent = entries.Get(i).As<Napi::Object>();
    std::string name = ent.Get("name").As<Napi::String>().Utf8Value();
    off_t off = static_cast<off_t>(NumberField(ent, "off"));
    Napi::Object attr = ent.Get("attr").As<Napi::Object>();
    size_t room = buf.size() - used;
    size_t need;
    if (plus) {
      fuse_entry_param e = ToEntry(attr, entryTimeout, attrTimeout);
      need = fuse_add_direntry_plus(p.req, buf.data() + used, room, name.c_str(), &e, off);
    } else {
      struct stat st = ToStat(attr);
      need = fuse_add_direntry(p.req, buf.data() + used, room, name.c_str(), &st, off);
    }
    if (need > room) break;  // the rest comes with the next readdir from this offset
    used += need;
  }
  fuse_reply_buf(p.req, buf.data(), used);
  return Napi::Boolean::New(info.Env(), true);
}

// replyStatfs(id, {bsize, frsize, blocks, bfree, bavail, files, ffree, namemax})
Napi::Value Session::ReplyStatfs(const Napi::CallbackInfo& info) {
  Pending p;
  if (!Take(info, &p)) return Napi::Boolean::New(info.Env(), false);
  Napi::Object o = info[1].As<Napi::Object>();
  struct statvfs st;
  std::memset(&st, 0, sizeof st);
  st.f_bsize = static_cast<unsigned long>(NumberField(o, "bsize", 4096));
  st.f_frsize = static_cast<unsigned long>(NumberField(o, "frsize", st.f_bsize));
  st.f_blocks = static_cast<fsblkcnt_t>(NumberField(o, "blocks"));
  st.f_bfree = static_cast<fsblkcnt_t>(NumberField(o, "bfree"));
  st.f_bavail = static_cast<fsblkcnt_t>(NumberField(o, "bavail"));
  st.f_files = static_cast<fsfilcnt_t>(NumberField(o, "files"));
  st.f_ffree = static_cast<fsfilcnt_t>(NumberField(o, "ffree"));
  st.f_namemax = static_cast<unsigned long>(NumberField(o, "namemax", 255));
  fuse_reply_statfs(p.req, &st);
  return Napi::Boolean::New(info.Env(), true);
}

// replyXattr(id, buffer): a value (getxattr) or NUL-separated names (listxattr); handles the
// size probe (size 0) and ERANGE as the xattr calls expect.
Napi::Value Session::ReplyXattr(const Napi::CallbackInfo& info) {
  Pending p;
  if (!Take(info, &p)) return Napi::Boolean::New(info.Env(), false);
  auto buf = info[1].As<Napi::Buffer<char>>();
  if (p.size == 0) fuse_reply_xattr(p.req, buf.Length());
  else if (buf.Length() > p.size) fuse_reply_err(p.req, ERANGE);
  else fuse_reply_buf(p.req, buf.Data(), buf.Length());
  return Napi::Boolean::New(info.Env(), true);
}

}  // namespace starling_fuse
