// Digests computed on the libuv thread pool, reading the caller's buffer in place (it is held by a
// reference until the job ends; the caller must not change it meanwhile).
//
//   new Hasher(algorithm)        an incremental digest ("sha256", "sha512")
//   hasher.update(bytes)      -> Promise<void>; one update at a time (a second one throws)
//   hasher.hex()              -> the final digest as lowercase hex; the hasher is spent after it
//   sha256(bytes)             -> Promise<string>, hex
//   crc32c(bytes)             -> Promise<number>, CRC-32C (Castagnoli), as an unsigned 32-bit value
#include <napi.h>

#include <openssl/evp.h>

#include <cstdint>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace {

// ---- CRC-32C ---------------------------------------------------------------------------------

constexpr uint32_t kCastagnoliReflected = 0x82F63B78u;

struct CrcTable {
  uint32_t entries[256];
  CrcTable() {
    for (uint32_t byte = 0; byte < 256; byte++) {
      uint32_t crc = byte;
      for (int bit = 0; bit < 8; bit++) crc = (crc >> 1) ^ ((crc & 1) ? kCastagnoliReflected : 0);
      entries[byte] = crc;
    }
  }
};

uint32_t Crc32cPortable(const uint8_t* data, size_t length) {
  static const CrcTable table;
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < length; i++) crc = table.entries[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(const uint8_t* data, size_t length) {
  uint64_t crc = 0xFFFFFFFFu;
  while (length >= 8) {
    uint64_t word;
    std::memcpy(&word, data, sizeof word);
    crc = _mm_crc32_u64(crc, word);
    data += 8;
    length -= 8;
  }
  uint32_t narrow = static_cast<uint32_t>(crc);
  while (length--) narrow = _mm_crc32_u8(narrow, *data++);
  return ~narrow;
}
#endif

uint32_t Crc32c(const uint8_t* data, size_t length) {
#if defined(__x86_64__)
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  if (hardware) return Crc32cSse42(data, length);
#endif
  return Crc32cPortable(data, length);
}

// ---- digests ---------------------------------------------------------------------------------

std::string Hex(const unsigned char* bytes, unsigned int length) {
  static const char digits[] = "0123456789abcdef";
  std::string out(length * 2, '0');
  for (unsigned int i = 0; i < length; i++) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 0xF];
  }
  return out;
}

class Hasher : public Napi::ObjectWrap<Hasher> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "Hasher", {InstanceMethod<&Hasher::Update>("update"), InstanceMethod<&Hasher::HexDigest>("hex")});
  }

  explicit Hasher(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Hasher>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsString()) throw Napi::TypeError::New(env, "Hasher(algorithm): algorithm must be a string");
    std::string name = info[0].As<Napi::String>();
    const EVP_MD* md = EVP_get_digestbyname(name.c_str());
    if (md == nullptr) throw Napi::Error::New(env, "unsupported digest algorithm: " + name);
    context_ = EVP_MD_CTX_new();
    if (context_ == nullptr || EVP_DigestInit_ex(context_, md, nullptr) != 1) throw Napi::Error::New(env, "could not start a " + name + " digest");
  }

  ~Hasher() override { EVP_MD_CTX_free(context_); }

  // Called on a pool thread; `busy_` keeps a second job away meanwhile.
  bool Consume(const uint8_t* data, size_t length) { return EVP_DigestUpdate(context_, data, length) == 1; }
  void Release() { busy_ = false; }

 private:
  Napi::Value Update(const Napi::CallbackInfo& info);

  Napi::Value HexDigest(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (busy_) throw Napi::Error::New(env, "hex() called while an update is running");
    if (finished_) throw Napi::Error::New(env, "hex() called twice");
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    if (EVP_DigestFinal_ex(context_, digest, &length) != 1) throw Napi::Error::New(env, "could not finish the digest");
    finished_ = true;
    return Napi::String::New(env, Hex(digest, length));
  }

  EVP_MD_CTX* context_ = nullptr;
  bool busy_ = false;
  bool finished_ = false;
};

enum class Job { kUpdate, kSha256, kCrc32c };

class DigestWork : public Napi::AsyncWorker {
 public:
  DigestWork(Napi::Env env, Job job, Napi::Uint8Array bytes, Hasher* hasher)
      : Napi::AsyncWorker(env, "starling-digest"),
        deferred_(Napi::Promise::Deferred::New(env)),
        job_(job),
        data_(bytes.Data()),
        length_(bytes.ByteLength()),
        hasher_(hasher) {
    bytes_ = Napi::Persistent(bytes.As<Napi::Object>());
    if (hasher_ != nullptr) hasherObject_ = Napi::Persistent(hasher_->Value());
  }

  Napi::Promise Promise() const { return deferred_.Promise(); }

 protected:
  void Execute() override {
    switch (job_) {
      case Job::kUpdate:
        if (!hasher_->Consume(data_, length_)) SetError("digest update failed");
        break;
      case Job::kSha256: {
        unsigned char digest[EVP_MAX_MD_SIZE];
        unsigned int length = 0;
        if (EVP_Digest(data_, length_, digest, &length, EVP_sha256(), nullptr) != 1) SetError("SHA-256 failed");
        else hex_ = Hex(digest, length);
        break;
      }
      case Job::kCrc32c:
        crc_ = Crc32c(data_, length_);
        break;
    }
  }

  void OnOK() override {
    if (hasher_ != nullptr) hasher_->Release();
    Napi::Env env = Env();
    switch (job_) {
      case Job::kUpdate: deferred_.Resolve(env.Undefined()); break;
      case Job::kSha256: deferred_.Resolve(Napi::String::New(env, hex_)); break;
      case Job::kCrc32c: deferred_.Resolve(Napi::Number::New(env, crc_)); break;
    }
  }

  void OnError(const Napi::Error& error) override {
    if (hasher_ != nullptr) hasher_->Release();
    deferred_.Reject(error.Value());
  }

 private:
  Napi::Promise::Deferred deferred_;
  Job job_;
  const uint8_t* data_;
  size_t length_;
  Hasher* hasher_;
  Napi::ObjectReference bytes_;
  Napi::ObjectReference hasherObject_;
  std::string hex_;
  uint32_t crc_ = 0;
};

Napi::Uint8Array BytesArgument(const Napi::CallbackInfo& info, const char* what) {
  if (info.Length() < 1 || !info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
    throw Napi::TypeError::New(info.Env(), std::string(what) + ": expected a Buffer or Uint8Array");
  }
  return info[0].As<Napi::Uint8Array>();
}

Napi::Value Hasher::Update(const Napi::CallbackInfo& info) {
  Napi::Uint8Array bytes = BytesArgument(info, "update");
  if (finished_) throw Napi::Error::New(info.Env(), "update() after hex()");
  if (busy_) throw Napi::Error::New(info.Env(), "update() while another update is running");
  busy_ = true;
  auto* work = new DigestWork(info.Env(), Job::kUpdate, bytes, this);
  work->Queue();
  return work->Promise();
}

Napi::Value Sha256(const Napi::CallbackInfo& info) {
  auto* work = new DigestWork(info.Env(), Job::kSha256, BytesArgument(info, "sha256"), nullptr);
  work->Queue();
  return work->Promise();
}

Napi::Value Crc32cAsync(const Napi::CallbackInfo& info) {
  auto* work = new DigestWork(info.Env(), Job::kCrc32c, BytesArgument(info, "crc32c"), nullptr);
  work->Queue();
  return work->Promise();
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("Hasher", Hasher::Define(env));
  exports.Set("sha256", Napi::Function::New(env, Sha256, "sha256"));
  exports.Set("crc32c", Napi::Function::New(env, Crc32cAsync, "crc32c"));
  return exports;
}

}  // namespace

NODE_API_MODULE(starling_digest, Init)
