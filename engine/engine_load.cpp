// Weights loads that check their values themselves (import_hf): each unit's
// shard written straight from the loader's buffers (engine.h,
// begin_shard_load), without write_shard's staging copy, second check and
// restore()'s second pass that narrows the parameters.
#include <algorithm>
#include <vector>

#include "zest/core/check.h"
#include "zest/engine/engine.h"
#include "zest/engine/engine_state.h"
#include "zest/memory/copy.h"
#include "zest/optim/grad_ops.h"

namespace zest {

bool Engine::shard_in_host_memory(int unit) {
  if (stream_.device().is_host()) return true;
  if (!shard_on_host(unit)) return false;  // the parameters are on the device
  if (impl_->layout->unit(unit).frozen) return true;
  for (const ShardPiece& p : shard_pieces(unit, 0)) {
    if (p.end > p.begin && !p.host) return false;
  }
  return true;
}

bool Engine::begin_shard_load(int unit) {
  check_finalized("begin_shard_load()");
  settle_offload();
  (void)state(unit);  // checks the index
  if (!impl_->layout->unit(unit).frozen) {
    const Stream host = Stream::default_for(Device::host());
    for (int b = 1; b < shard_buffers(); ++b) {
      for (const ShardPiece& p : shard_pieces(unit, b)) {
        fill_zero(p.host ? host : stream_, p.data, (p.end - p.begin) * elem_size(p.dtype));
      }
    }
    stream_.synchronize();
  }
  return shard_in_host_memory(unit);
}

void Engine::load_shard(int unit, size_t at, const void* values, DType dtype, size_t n) {
  (void)state(unit);  // checks the index
  const UnitLayout& U = impl_->layout->unit(unit);
  ZEST_CHECK(at <= U.shard && n <= U.shard - at, "load_shard of unit '{}': elements [{}, {}) are past its shard of {}",
             U.name, at, at + n, U.shard);
  ZEST_CHECK(is_floating(dtype), "load_shard of unit '{}': values of {} (fp32, fp16 or bf16 only)", U.name,
             dtype_name(dtype));
  ZEST_CHECK(values != nullptr || n == 0, "load_shard of unit '{}': null values for {} elements", U.name, n);
  if (n == 0) return;
  const auto* src = static_cast<const std::byte*>(values);
  const size_t esize = elem_size(dtype);
  // The master's pieces overlapping [at, at + n). Where the master is the
  // parameters (fp32, bf16 master weights) the device piece is written below.
  const auto masters = [&](auto&& write) {
    if (U.frozen) return;
    for (const ShardPiece& p : shard_pieces(unit, 0)) {
      const size_t lo = std::max(at, p.begin), hi = std::min(at + n, p.end);
      if (lo >= hi || (!p.host && master_is_params())) continue;
      write(p, lo, hi, src + (lo - at) * esize);
    }
  };
  const Stream host = Stream::default_for(Device::host());
  if (shard_in_host_memory(unit)) {
    // Plain host code, so several threads may load disjoint ranges at once.
    // Converting from the stored dtype straight to each destination gives
    // the bits of a detour through fp32: widening is exact.
    masters([&](const ShardPiece& p, size_t lo, size_t hi, const std::byte* from) {
      convert(host, from, dtype, p.at(lo), p.dtype, hi - lo);
    });
    convert(host, src, dtype, owned_params(unit) + at * elem_size(compute_dtype_), compute_dtype_, n);
    return;
  }
  // Device memory: the transfers and narrowing kernels take fp32.
  std::vector<float> widened;
  const float* fp32 = reinterpret_cast<const float*>(src);
  if (dtype != DType::kFloat32) {
    widened.resize(n);
    convert(host, src, dtype, widened.data(), DType::kFloat32, n);
    fp32 = widened.data();
  }
  masters([&](const ShardPiece& p, size_t lo, size_t hi, const std::byte*) {
    piece_from_fp32(p, lo, hi, fp32 + (lo - at), /*src_host=*/true);
  });
  Buffer staging = allocator_.allocate_buffer(n * 4, stream_, MemoryCategory::kCommBuffers);
  copy_bytes(stream_, staging.data(), fp32, n * 4);
  Buffer scratch;
  if (shard_on_host(unit)) {
    scratch = allocator_.allocate_buffer(n * elem_size(compute_dtype_), stream_, MemoryCategory::kCommBuffers);
  }
  narrow_into_shard(unit, staging.as<float>(), at, n, scratch.as<std::byte>());
  stream_.synchronize();  // before `staging` and `values` go
}

void Engine::finish_shard_load(const Progress& progress) {
  restore_progress(progress);
  gather_updated_params(/*frozen_too=*/true);
  stream_.synchronize();
}

}  // namespace zest
