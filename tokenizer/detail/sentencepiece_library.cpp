#include "zest/tokenizer/detail/sentencepiece_library.h"

#include <dlfcn.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "zest/core/check.h"
#include "zest/tokenizer/detail/sentencepiece_shim.h"

namespace zest::detail {

namespace {

struct Module {
  decltype(&zest_spm_load) load = nullptr;
  decltype(&zest_spm_free) free = nullptr;
  decltype(&zest_spm_encode) encode = nullptr;
  decltype(&zest_spm_piece_size) piece_size = nullptr;
  decltype(&zest_spm_piece_to_id) piece_to_id = nullptr;
  decltype(&zest_spm_id_to_piece) id_to_piece = nullptr;
  decltype(&zest_spm_bos_id) bos_id = nullptr;
  decltype(&zest_spm_eos_id) eos_id = nullptr;
  decltype(&zest_spm_unk_id) unk_id = nullptr;
};

// RTLD_DEEPBIND keeps the module's calls on its own protobuf; the
// sanitizers' runtimes refuse it, and their builds load no libprotobuf of
// their own beside it (the tests that run under them do not link libtorch).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kOpenFlags = RTLD_NOW | RTLD_LOCAL;
#else
constexpr int kOpenFlags = RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND;
#endif

template <typename F>
void bind(void* handle, const char* name, F& out, const std::string& path) {
  void* symbol = dlsym(handle, name);
  ZEST_CHECK(symbol != nullptr, "{}: no symbol {} (a module of another ZEST version?)", path, name);
  out = reinterpret_cast<F>(symbol);
}

Module open_module() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("ZEST_SENTENCEPIECE_MODULE"); env != nullptr && *env != '\0') {
    candidates.emplace_back(env);
  } else {
    candidates = {ZEST_SENTENCEPIECE_MODULE_BUILD, ZEST_SENTENCEPIECE_MODULE_INSTALL};
  }
  std::string tried;
  for (const std::string& path : candidates) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      tried += fmt::format("\n  {}: not there", path);
      continue;
    }
    void* handle = dlopen(path.c_str(), kOpenFlags);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried += fmt::format("\n  {}: {}", path, why != nullptr ? why : "dlopen failed");
      continue;
    }
    Module m;
    bind(handle, "zest_spm_load", m.load, path);
    bind(handle, "zest_spm_free", m.free, path);
    bind(handle, "zest_spm_encode", m.encode, path);
    bind(handle, "zest_spm_piece_size", m.piece_size, path);
    bind(handle, "zest_spm_piece_to_id", m.piece_to_id, path);
    bind(handle, "zest_spm_id_to_piece", m.id_to_piece, path);
    bind(handle, "zest_spm_bos_id", m.bos_id, path);
    bind(handle, "zest_spm_eos_id", m.eos_id, path);
    bind(handle, "zest_spm_unk_id", m.unk_id, path);
    return m;
  }
  ZEST_FAIL("the SentencePiece module (zest_sentencepiece) could not be opened:{}\nset ZEST_SENTENCEPIECE_MODULE to "
            "its path, or reinstall ZEST",
            tried);
}

const Module& module() {
  static const Module m = open_module();  // a failure throws, and the next call tries again
  return m;
}

void append_ids(void* context, const int* ids, size_t count) {
  auto& out = *static_cast<std::vector<int64_t>*>(context);
  out.insert(out.end(), ids, ids + count);
}

}  // namespace

SentencePieceModel::SentencePieceModel(std::string_view serialized, const std::string& where) : where_(where) {
  std::array<char, 512> error{};
  processor_ = module().load(serialized.data(), serialized.size(), error.data(), error.size());
  ZEST_CHECK(processor_ != nullptr, "{}: not a SentencePiece model: {}", where_, error.data());
}

SentencePieceModel::~SentencePieceModel() {
  if (processor_ != nullptr) module().free(processor_);
}

void SentencePieceModel::encode(std::string_view text, std::vector<int64_t>& out) const {
  std::array<char, 512> error{};
  const int rc = module().encode(processor_, text.data(), text.size(), append_ids, &out, error.data(), error.size());
  ZEST_CHECK(rc == 0, "{}: SentencePiece could not encode {} bytes of text: {}", where_, text.size(), error.data());
}

int64_t SentencePieceModel::pieces() const { return module().piece_size(processor_); }

int64_t SentencePieceModel::piece_to_id(std::string_view piece) const {
  return module().piece_to_id(processor_, piece.data(), piece.size());
}

std::string SentencePieceModel::id_to_piece(int64_t id) const {
  size_t bytes = 0;
  const char* p = module().id_to_piece(processor_, static_cast<int>(id), &bytes);
  return p != nullptr ? std::string(p, bytes) : std::string();
}

int64_t SentencePieceModel::bos_id() const { return module().bos_id(processor_); }
int64_t SentencePieceModel::eos_id() const { return module().eos_id(processor_); }
int64_t SentencePieceModel::unk_id() const { return module().unk_id(processor_); }

}  // namespace zest::detail
