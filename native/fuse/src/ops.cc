// Low-level callbacks, run on the session's loop thread. None of them blocks: each hands
// the request to the JS thread (or, for forget, answers it at once) and returns.
#include "ops.h"

#include <algorithm>

#include "session.h"

namespace starling_fuse {
namespace {

Session* SessionOf(fuse_req_t req) { return static_cast<Session*>(fuse_req_userdata(req)); }

void Post(fuse_req_t req, Op op, fuse_ino_t ino, Request* r = nullptr) {
  if (!r) r = new Request();
  r->op = op;
  r->req = req;
  r->ino = ino;
  SessionOf(req)->Post(r);
}

void Init(void* userdata, fuse_conn_info* conn) {
  const MountSettings& s = static_cast<Session*>(userdata)->settings();
  // The kernel proposes its read-ahead; we may only lower it.
  if (s.maxReadahead) conn->max_readahead = std::min(conn->max_readahead, s.maxReadahead);
  if (s.maxBackground) conn->max_background = s.maxBackground;
  if (s.congestionThreshold) conn->congestion_threshold = s.congestionThreshold;
  // Reads are answered out of order from JS: let the kernel keep several in flight.
  if (conn->capable & FUSE_CAP_ASYNC_READ) conn->want |= FUSE_CAP_ASYNC_READ;
  if (conn->capable & FUSE_CAP_READDIRPLUS) conn->want |= FUSE_CAP_READDIRPLUS;
  // Replies that name a file (replyFds) are spliced from it into /dev/fuse: no copy in user space.
  if (conn->capable & FUSE_CAP_SPLICE_WRITE) conn->want |= FUSE_CAP_SPLICE_WRITE;
  // The layer never changes: no need to re-check the page cache when attributes expire.
  conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
}

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto* r = new Request();
  r->name = name;
  Post(req, Op::Lookup, parent, r);
}

void Forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  auto* r = new Request();
  r->op = Op::Forget;
  r->req = nullptr;
  r->ino = ino;
  r->nlookup = nlookup;
  Session* s = SessionOf(req);
  fuse_reply_none(req);  // forget has no answer; JS is only told
  s->Post(r);
}

void ForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  Session* s = SessionOf(req);
  for (size_t i = 0; i < count; i++) {
    auto* r = new Request();
    r->op = Op::Forget;
    r->req = nullptr;
    r->ino = forgets[i].ino;
    r->nlookup = forgets[i].nlookup;
    s->Post(r);
  }
  fuse_reply_none(req);
}

void Getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) { Post(req, Op::Getattr, ino); }
void Readlink(fuse_req_t req, fuse_ino_t ino) { Post(req, Op::Readlink, ino); }
void Statfs(fuse_req_t req, fuse_ino_t ino) { Post(req, Op::Statfs, ino); }

void OpenLike(fuse_req_t req, Op op, fuse_ino_t ino, fuse_file_info* fi) {
  auto* r = new Request();
  r->flags = fi->flags;
  Post(req, op, ino, r);
}
void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) { OpenLike(req, Op::Open, ino, fi); }
void Opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) { OpenLike(req, Op::Opendir, ino, fi); }

void ReadLike(fuse_req_t req, Op op, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  auto* r = new Request();
  r->size = size;
  r->off = off;
  r->fh = fi->fh;
  Post(req, op, ino, r);
}
void Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) { ReadLike(req, Op::Read, ino, size, off, fi); }
void Readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) { ReadLike(req, Op::Readdir, ino, size, off, fi); }
void Readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  ReadLike(req, Op::Readdirplus, ino, size, off, fi);
}

void ReleaseLike(fuse_req_t req, Op op, fuse_ino_t ino, fuse_file_info* fi) {
  auto* r = new Request();
  r->fh = fi->fh;
  Post(req, op, ino, r);
}
void Release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) { ReleaseLike(req, Op::Release, ino, fi); }
void Releasedir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) { ReleaseLike(req, Op::Releasedir, ino, fi); }

void Getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  auto* r = new Request();
  r->name = name;
  r->size = size;
  Post(req, Op::Getxattr, ino, r);
}

void Listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  auto* r = new Request();
  r->size = size;
  Post(req, Op::Listxattr, ino, r);
}

fuse_lowlevel_ops MakeOps() {
  fuse_lowlevel_ops ops{};
  ops.init = Init;
  ops.lookup = Lookup;
  ops.forget = Forget;
  ops.forget_multi = ForgetMulti;
  ops.getattr = Getattr;
  ops.readlink = Readlink;
  ops.open = Open;
  ops.read = Read;
  ops.release = Release;
  ops.opendir = Opendir;
  ops.readdir = Readdir;
  ops.readdirplus = Readdirplus;
  ops.releasedir = Releasedir;
  ops.statfs = Statfs;
  ops.getxattr = Getxattr;
  ops.listxattr = Listxattr;
  return ops;
}

}  // namespace

const fuse_lowlevel_ops* LowLevelOps() {
  static const fuse_lowlevel_ops ops = MakeOps();
  return &ops;
}

}  // namespace starling_fuse
