// libFuzzer target: any bytes, as a safetensors file in memory (no file I/O,
// so each run is cheap and deterministic). Opening validates the header; each
// tensor is then read whole, by range, and converted to every floating ZEST
// type with the finite check on.
//
// A zest::Error is the expected answer to malformed input. A finding is
// anything else: another exception, a crash, a sanitizer report, or a broken
// promise of the reader, checked below (the tensors tile the data region; the
// data order; lookups by name).
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "zest/core/check.h"
#include "zest/checkpoint/safetensors.h"

namespace {

using zest::DType;
using zest::SafetensorsFile;
using zest::SafetensorsTensor;

void require(bool promise) {
  if (!promise) __builtin_trap();
}

void read_every_way(const SafetensorsFile& f, const SafetensorsTensor& t) {
  // Sizes are validated against the input, so these buffers are bounded by it.
  std::vector<std::byte> raw(t.size_bytes());
  f.read(t.name, raw);
  f.read_range(t.name, t.size_bytes() / 2, std::span(raw).subspan(t.size_bytes() / 2));
  try {
    f.read(t.name, raw, {.check_finite = true});
  } catch (const zest::Error&) {
    // Not finite: an answer, not a finding.
  }
  for (const DType want : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    std::vector<std::byte> out(t.numel * zest::elem_size(want));
    try {
      f.read_as(t.name, want, out, {.check_finite = true});
    } catch (const zest::Error&) {
      // Not convertible, or not finite: both are answers, not findings.
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const SafetensorsFile f =
        SafetensorsFile::from_source(zest::make_safetensors_memory_source(bytes), "<fuzz input>");
    uint64_t covered = 0;
    for (const SafetensorsTensor& t : f.tensors()) {
      require(t.begin == covered && t.size_bytes() == t.numel * t.elem_size);
      require(f.find(t.name) == &t);
      covered = t.end;
      read_every_way(f, t);
    }
    require(f.data_begin() + covered == size);
  } catch (const zest::Error&) {
    // Malformed input, reported: the reader's job.
  }
  return 0;
}
