// sendFile(socketFd, fileFd, offset, count, timeoutMs) -> Promise<number of bytes sent>.
//
// Both descriptors are dup()ed before the thread starts, so that JavaScript closing the socket or
// the file meanwhile can never make the thread write into a descriptor number that was reused.
// The socket is non-blocking (libuv's): on EAGAIN the thread poll()s for writability, giving up
// after timeoutMs without progress. SIGPIPE is ignored by Node, so a client that went away is an
// EPIPE/ECONNRESET error, not a signal.
#include <napi.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include <poll.h>
#include <sys/sendfile.h>
#include <unistd.h>

namespace {

struct Outcome {
  Napi::Promise::Deferred deferred;
  size_t sent = 0;
  int error = 0;
  std::string where;
};

void Settle(Napi::Env env, Napi::Function, void*, Outcome* outcome) {
  if (env == nullptr) {  // the environment is going away: nobody is left to tell
    delete outcome;
    return;
  }
  if (outcome->error == 0) {
    outcome->deferred.Resolve(Napi::Number::New(env, static_cast<double>(outcome->sent)));
  } else {
    Napi::Error error = Napi::Error::New(env, std::string(outcome->where) + ": " + std::strerror(outcome->error));
    error.Set("code", Napi::String::New(env, outcome->error == ETIMEDOUT ? "ETIMEDOUT" : outcome->error == EPIPE ? "EPIPE" : outcome->error == ECONNRESET ? "ECONNRESET" : "ESENDFILE"));
    error.Set("errno", Napi::Number::New(env, outcome->error));
    error.Set("bytesSent", Napi::Number::New(env, static_cast<double>(outcome->sent)));
    outcome->deferred.Reject(error.Value());
  }
  delete outcome;
}

using Tsfn = Napi::TypedThreadSafeFunction<void, Outcome, Settle>;

void Transfer(int out, int in, off_t offset, size_t count, int timeoutMs, Outcome* outcome) {
  while (outcome->sent < count) {
    size_t want = count - outcome->sent;
    if (want > (1u << 30)) want = 1u << 30;
    ssize_t n = ::sendfile(out, in, &offset, want);
    if (n > 0) {
      outcome->sent += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      outcome->error = ENODATA;
      outcome->where = "sendfile: the file ended early";
      break;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN) {
      outcome->error = errno;
      outcome->where = "sendfile";
      break;
    }
    struct pollfd ready = {out, POLLOUT, 0};
    int polled = ::poll(&ready, 1, timeoutMs);
    if (polled < 0 && errno == EINTR) continue;
    if (polled < 0) {
      outcome->error = errno;
      outcome->where = "poll";
      break;
    }
    if (polled == 0) {
      outcome->error = ETIMEDOUT;
      outcome->where = "sendfile: the client read nothing";
      break;
    }
    if (ready.revents & (POLLERR | POLLHUP | POLLNVAL)) {
      outcome->error = EPIPE;
      outcome->where = "sendfile: the client went away";
      break;
    }
  }
  ::close(out);
  ::close(in);
}

Napi::Value SendFile(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 5 || !info[0].IsNumber() || !info[1].IsNumber() || !info[2].IsNumber() || !info[3].IsNumber() || !info[4].IsNumber()) {
    throw Napi::TypeError::New(env, "sendFile(socketFd, fileFd, offset, count, timeoutMs)");
  }
  int socketFd = info[0].As<Napi::Number>().Int32Value();
  int fileFd = info[1].As<Napi::Number>().Int32Value();
  double offset = info[2].As<Napi::Number>().DoubleValue();
  double count = info[3].As<Napi::Number>().DoubleValue();
  int timeoutMs = info[4].As<Napi::Number>().Int32Value();
  if (offset < 0 || count < 0) throw Napi::RangeError::New(env, "offset and count must not be negative");

  auto* outcome = new Outcome{Napi::Promise::Deferred::New(env)};
  Napi::Promise promise = outcome->deferred.Promise();
  int out = ::dup(socketFd);
  int in = out < 0 ? -1 : ::dup(fileFd);
  if (out < 0 || in < 0) {
    int error = errno;
    if (out >= 0) ::close(out);
    delete outcome;
    throw Napi::Error::New(env, std::string("dup: ") + std::strerror(error));
  }
  Tsfn done = Tsfn::New(env, "starling-sendfile", 0, 1);
  std::thread([=]() mutable {
    Transfer(out, in, static_cast<off_t>(offset), static_cast<size_t>(count), timeoutMs, outcome);
    done.BlockingCall(outcome);
    done.Release();
  }).detach();
  return promise;
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("sendFile", Napi::Function::New(env, SendFile));
  return exports;
}

}  // namespace

NODE_API_MODULE(starling_sendfile, Init)
