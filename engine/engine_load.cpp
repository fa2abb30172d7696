// Weights loads that check their values themselves (import_hf): each unit's
// shard written straight from the loader's buffers (engine.h,
// begin_shard_load), without write_shard's staging copy, second check and
// restore()'s second pass that narrows the parameters.
//
// Note [a master widened when first read]: a checkpoint published in the
// compute dtype (bf16, as Hugging Face publishes most models) holds the
// parameters' bits, and the fp32 master weights it implies are those bits
// widened, exactly. Writing that master at load time would write 4 bytes an
// element beside the parameters' 2, for values nothing reads until the
// first optimizer step (or a checkpoint or export): three times the memory
// traffic of the read itself. So where a unit's whole shard comes in the
// compute dtype and its master is an fp32 copy in host memory, the load
// writes only the parameters (read from the file straight into them:
// ShardLoad::in_place) and marks the master deferred; every reader of the
// master goes through shard_pieces(u, 0), which widens it first, and the
// optimizer step widens every deferred master before it starts (the
// offloaded part's update reads its buffer directly). The master's memory
// exists all along; only its values wait. Until then the invariant the
// engine keeps otherwise, parameters = the master narrowed, holds the other
// way round: master = the parameters widened.
#include <algorithm>
#include <vector>

#include "zest/core/check.h"
#include "zest/engine/engine.h"
#include "zest/engine/detail/engine_state.h"
#include "zest/memory/copy.h"
#include "zest/optim/grad_ops.h"

namespace zest {

bool Engine::Impl::shard_in_host_memory(int unit) {
  // A master in a swap file is written through a staged copy (Note [host
  // pieces in a swap file]), one call at a time: never in place, never from
  // several threads.
  if (offload_ && offload_->swap() && units_[static_cast<size_t>(unit)].host_numel > 0) {
    return false;
  }
  if (shard_in_swap(unit)) return false;  // likewise the parameters (offload_param nvme)
  if (stream_.device().is_host()) return true;
  if (!shard_on_host(unit)) return false;  // the parameters are on the device
  if (layout_->unit(unit).frozen) return true;
  for (const ShardPiece& p : stored_shard_pieces(unit, 0)) {
    if (p.end > p.begin && !p.host) return false;
  }
  return true;
}

Engine::ShardLoad Engine::Impl::begin_shard_load(int unit, std::optional<DType> every_value) {
  check_finalized("begin_shard_load()");
  settle_offload();
  UnitState& st = state(unit);  // checks the index
  const UnitLayout& U = layout_->unit(unit);
  // A master still waiting for the previous load's parameters is widened
  // before they change (a part of it may keep its values: a parameter the
  // new load does not hold).
  widen_deferred_master(unit);
  if (!U.frozen) {
    const Stream host = Stream::default_for(Device::host());
    for (int b = 1; b < shard_buffers(); ++b) {
      for (const ShardPiece& stored : shard_pieces(unit, b)) {
        std::vector<std::byte> staging;
        const ShardPiece p = staged(unit, b, stored, stored.begin, stored.end, staging, /*read=*/false);
        fill_zero(p.host ? host : stream_, p.data, (p.end - p.begin) * elem_size(p.dtype));
        stream_.synchronize();
        unstage(unit, b, stored, p);
      }
    }
  }
  ShardLoad load;
  load.threads = shard_in_host_memory(unit);
  const bool copies_only = load.threads && every_value == compute_dtype_;
  st.master_deferred = copies_only && !U.frozen && !master_is_params();
  st.loading_in_place = copies_only && (U.frozen || st.master_deferred);
  if (st.loading_in_place) load.in_place = {owned_params(unit), U.shard * elem_size(compute_dtype_)};
  return load;
}

void Engine::Impl::abandon_shard_load(int unit) {
  if (param_swap_) param_swap_->flush();  // another unit's pieces may be staged
  UnitState& st = state(unit);
  const UnitLayout& U = layout_->unit(unit);
  if (st.master_deferred) {
    // The master holds the values from before the load: the parameters
    // become them again, as restore() narrows them (cleared first, so that
    // the master is not widened from the parameters being replaced).
    st.master_deferred = false;
    params_from_master(unit);
    stream_.synchronize();
  } else if (st.loading_in_place && U.frozen) {
    fill_zero(Stream::default_for(Device::host()), owned_params(unit), U.shard * elem_size(compute_dtype_));
  }
  st.loading_in_place = false;
}

void Engine::Impl::load_shard(int unit, size_t at, const void* values, DType dtype, size_t n) {
  (void)state(unit);  // checks the index
  const UnitLayout& U = layout_->unit(unit);
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
  const UnitState& st = units_[static_cast<size_t>(unit)];
  ZEST_CHECK(!st.master_deferred || dtype == compute_dtype_,
             "load_shard of unit '{}': values of {} into a load begun for {} only (begin_shard_load's every_value)",
             U.name, dtype_name(dtype), dtype_name(compute_dtype_));
  const auto masters = [&](auto&& write) {
    if (U.frozen || st.master_deferred) return;
    for (const ShardPiece& p : stored_shard_pieces(unit, 0)) {
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
    std::vector<std::byte> staging;
    const ShardPiece s = staged(unit, 0, p, lo, hi, staging, /*read=*/false);
    piece_from_fp32(s, lo, hi, fp32 + (lo - at), /*src_host=*/true);
    unstage(unit, 0, p, s);
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

void Engine::Impl::finish_shard_load(const Progress& progress) {
  if (param_swap_) param_swap_->flush();  // the last unit's pieces (Note [staged shard writes] in param_swap.h)
  for (UnitState& st : units_) st.loading_in_place = false;
  restore_progress(progress);
  gather_updated_params(/*frozen_too=*/true);
  stream_.synchronize();
}

}  // namespace zest
