// accumulate_exact (optim/grad_norm.h) spread over a grid of GPU blocks:
// the host-and-device pieces the CUDA kernel is made of, and a host model of
// the whole grid that the host tests compare with the host's own loop.
//
// Note [exact sum on a grid]. Thread t of block b adds the chunk sums
// b * threads + t, + blocks * threads, ... into words of its own
// (exact_add_strided); a block adds its threads' words in a tree
// (exact_merge), then adds its words into the accumulator with one atomic
// integer add per word, and a last one-thread kernel normalizes the
// accumulator. Every step is an integer addition of exact fixed-point words
// (exact_sum.h), so neither the number of blocks and threads nor the order in
// which the blocks' atomics land changes a bit: the result is the host's
// single loop to the bit, at any grid. Overflow: a thread's words are
// normalized every 2^24 adds (2^31 fit), and the accumulator, normalized on
// entry (limbs below 2^32), takes at most kExactMaxBlocks normalized block
// sums (each limb below 2^32) before its normalization.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "zest/core/platform.h"
#include "zest/optim/exact_sum.h"

namespace zest {

inline constexpr unsigned kExactThreads = 128;  // 128 x 22 words of shared memory: 22.5 KiB
inline constexpr size_t kExactSumsPerThread = 32;
inline constexpr size_t kExactMaxBlocks = 4096;

// Adds sums[first], sums[first + stride], ... (below count) into w, which
// it leaves normalized. A value outside exact_add's range cannot come from
// chunk_sums_of_squares (exact_sum.h's Note); were one there, it is counted
// as a NaN, so the step skips instead of using a wrong norm.
ZEST_HOST_DEVICE inline void exact_add_strided(int64_t* w, const double* sums, size_t count,
                                               size_t first, size_t stride) {
  size_t since = 0;
  for (size_t i = first; i < count; i += stride) {
    if (!exact_add(w, sums[i])) ++w[kExactNaNWord];
    if (++since == (size_t{1} << 24)) {  // 2^31 adds fit between normalizations
      exact_normalize(w);
      since = 0;
    }
  }
  exact_normalize(w);
}

// dst += src, both normalized; dst normalized after.
ZEST_HOST_DEVICE inline void exact_merge(int64_t* dst, const int64_t* src) {
  for (int k = 0; k < kExactWords; ++k) dst[k] += src[k];
  exact_normalize(dst);
}

// The grid for `count` sums: about kExactSumsPerThread per thread, at least
// one block, at most kExactMaxBlocks (threads then take more each).
inline unsigned exact_grid_blocks(size_t count) {
  const size_t per_block = kExactThreads * kExactSumsPerThread;
  return static_cast<unsigned>(std::clamp<size_t>((count + per_block - 1) / per_block, 1, kExactMaxBlocks));
}

// What the GPU computes with `blocks` blocks of `threads` threads (a power
// of two), step by step on the host: for the tests, which compare it with
// accumulate_exact's host loop at many grids.
inline void accumulate_exact_grid_model(const double* sums, size_t count, int64_t* acc,
                                        unsigned blocks, unsigned threads) {
  std::vector<int64_t> words(static_cast<size_t>(threads) * kExactWords);
  for (unsigned b = 0; b < blocks; ++b) {
    std::fill(words.begin(), words.end(), int64_t{0});
    for (unsigned t = 0; t < threads; ++t) {
      exact_add_strided(&words[t * kExactWords], sums, count, static_cast<size_t>(b) * threads + t,
                        static_cast<size_t>(blocks) * threads);
    }
    for (unsigned half = threads / 2; half > 0; half /= 2) {
      for (unsigned t = 0; t < half; ++t) exact_merge(&words[t * kExactWords], &words[(t + half) * kExactWords]);
    }
    for (int k = 0; k < kExactWords; ++k) acc[k] += words[k];  // the block's atomic adds
  }
  exact_normalize(acc);  // the last kernel
}

}  // namespace zest
