#include "common/weights_digest.h"

#include <bit>

#include <fmt/format.h>

namespace examples {

namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

}  // namespace

uint64_t weights_digest(zest::Engine& engine) {
  uint64_t h = kFnvOffset;
  for (const zest::UnitLayout& unit : engine.layout().units()) {
    for (const zest::ParamLayout& p : unit.params) {
      for (const float v : engine.param_master(p.name)) {
        const uint32_t bits = std::bit_cast<uint32_t>(v);
        for (int byte = 0; byte < 4; ++byte) {
          h ^= (bits >> (8 * byte)) & 0xffu;
          h *= kFnvPrime;
        }
      }
    }
  }
  return h;
}

std::string format_weights_digest(zest::Engine& engine, int stage) {
  return fmt::format("weights digest, stage {}: {:#018x} ({} values)", stage, weights_digest(engine),
                     engine.layout().numel());
}

}  // namespace examples
