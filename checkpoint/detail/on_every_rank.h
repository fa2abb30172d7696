// Runs a step that may fail on some ranks only (a file that one rank cannot
// read, say) and makes every rank agree on the outcome before the next
// collective: checkpoints and weight files use it around their I/O.
#pragma once

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "zest/core/check.h"
#include "zest/engine/engine.h"

namespace zest {

// Runs `fn` and agrees on the outcome over the ranks that `all_gather`
// (int64 words, every rank's in rank order) spans: if it threw anywhere, a
// failing rank rethrows its own exception and every other rank throws the
// error of the lowest failing rank r, "<what> failed <place(r)>: <message>"
// (the first 500 bytes of its message, as Error::message() without rank
// and location, travel with the agreement).
template <typename AllGather, typename Place, typename Fn>
inline void agree_on_outcome(AllGather&& all_gather, Place&& place, const char* what, Fn&& fn) {
  constexpr size_t kWords = 64;  // a flag, then the message's bytes
  std::string error;
  std::exception_ptr own;
  try {
    fn();
  } catch (const std::exception&) {
    own = std::current_exception();
    error = current_exception_text();
    if (error.empty()) error = "an error without a message";
  }
  std::array<int64_t, kWords> mine{};
  mine[0] = error.empty() ? 0 : 1;
  std::memcpy(&mine[1], error.data(), std::min(error.size(), (kWords - 1) * 8 - 1));
  const std::vector<int64_t> all = all_gather(std::span<const int64_t>(mine));
  for (size_t r = 0; r * kWords < all.size(); ++r) {
    if (all[r * kWords] == 0) continue;
    if (own) std::rethrow_exception(own);
    const char* text = reinterpret_cast<const char*>(&all[r * kWords + 1]);
    ZEST_FAIL("{} failed {}: {}", what, place(static_cast<int>(r)),
              std::string(text, strnlen(text, (kWords - 1) * 8)));
  }
}

// Runs `fn` on every rank of the engine's group and agrees on the outcome
// (agree_on_outcome), so no rank goes on to a collective the others never
// reach, and every rank's log says what went wrong.
template <typename Fn>
inline void on_every_rank(Engine& engine, const char* what, Fn&& fn) {
  agree_on_outcome([&](std::span<const int64_t> mine) { return engine.all_gather_scalars(mine); },
                   [](int r) { return fmt::format("on rank {}", r); }, what, std::forward<Fn>(fn));
}

}  // namespace zest
