// The owned shards: master weights and optimizer state as pieces on the
// device and, with offload, the host; what checkpoints read and write
// (read_shard, write_shard, unit_master) and restore() rebuilds the
// compute-dtype parameters from.
#include <algorithm>
#include <vector>

#include "zest/core/check.h"
#include "zest/engine/engine.h"
#include "zest/engine/detail/engine_state.h"
#include "zest/memory/copy.h"
#include "zest/optim/grad_ops.h"

namespace zest {

void Engine::Impl::settle_offload() {
  if (offload_) offload_->settle(stream_);
}

std::vector<float> Engine::Impl::unit_master(int unit) {
  check_finalized("unit_master()");
  settle_offload();
  const UnitLayout& U = layout_->unit(unit);
  std::vector<float> out(U.padded);
  if (U.frozen) {
    // No master: this rank's compute-dtype values widened (exactly) into
    // its place in an fp32 unit, gathered there in place.
    (void)state(unit);
    Buffer full = allocator_.allocate_buffer(U.padded * 4, stream_, MemoryCategory::kCommBuffers);
    const bool gathered = layout_->partitions() > 1;
    float* mine = full.as<float>() + (gathered ? U.shard * static_cast<size_t>(part_) : 0);
    Buffer temp;
    convert(stream_, readable_params(unit, temp), compute_dtype_, mine, DType::kFloat32, U.shard);
    if (gathered) shard_control().all_gather(mine, full.data(), U.shard, DType::kFloat32, stream_);
    copy_bytes(stream_, out.data(), full.data(), U.padded * 4);
    stream_.synchronize();
    return out;
  }
  std::array<ShardPiece, 2> pieces = shard_pieces(unit, 0);
  std::vector<std::byte> staging;
  pieces[0] = staged(unit, 0, pieces[0], pieces[0].begin, pieces[0].end, staging, /*read=*/true);
  if (layout_->partitions() == 1) {
    // The master is the whole unit: no gather, so no staging buffer.
    for (const ShardPiece& p : pieces) piece_to_fp32(p, p.begin, p.end, out.data() + p.begin, /*dst_host=*/true);
  } else {
    Buffer full = allocator_.allocate_buffer(U.padded * 4, stream_, MemoryCategory::kCommBuffers);
    // The collective reads fp32 in device memory: an offloaded or bf16
    // master comes through this rank's slot of `full` first.
    const float* mine = reinterpret_cast<const float*>(pieces[1].data);
    if (pieces[0].end > 0 || pieces[1].dtype != DType::kFloat32) {
      float* slot = full.as<float>() + U.shard * static_cast<size_t>(part_);
      for (const ShardPiece& p : pieces) piece_to_fp32(p, p.begin, p.end, slot + p.begin, /*dst_host=*/false);
      mine = slot;
    }
    shard_control().all_gather(mine, full.data(), U.shard, DType::kFloat32, stream_);
    copy_bytes(stream_, out.data(), full.data(), U.padded * 4);
  }
  stream_.synchronize();
  return out;
}

std::vector<float> Engine::Impl::param_master(const std::string& name) {
  check_finalized("param_master()");
  const ParamRef ref = layout_->find(name);
  const ParamLayout& p = layout_->param(ref);
  const std::vector<float> unit = unit_master(ref.unit);
  return {unit.begin() + static_cast<ptrdiff_t>(p.offset),
          unit.begin() + static_cast<ptrdiff_t>(p.offset + p.numel)};
}

std::byte* Engine::Impl::owned_part(const Buffer& full, int unit) const {
  const size_t shard = layout_->unit(unit).shard;
  return full.as<std::byte>() + shard * static_cast<size_t>(part_) * elem_size(compute_dtype_);
}

std::byte* Engine::Impl::owned_params(int unit) const {
  const UnitState& st = units_[static_cast<size_t>(unit)];
  return st.resident ? owned_part(st.params_full, unit) : st.params_shard.as<std::byte>();
}

std::array<Engine::Impl::ShardPiece, 2> Engine::Impl::shard_pieces(int unit, int buffer) {
  if (buffer == 0) widen_deferred_master(unit);
  return stored_shard_pieces(unit, buffer);
}

std::array<Engine::Impl::ShardPiece, 2> Engine::Impl::stored_shard_pieces(int unit, int buffer) {
  UnitState& st = state(unit);
  ZEST_CHECK(buffer >= 0 && buffer < shard_buffers(), "shard buffer {} is out of range: this optimizer has {}",
             buffer, shard_buffers());
  const Impl& im = *this;
  ZEST_INTERNAL_ASSERT(!im.layout_->unit(unit).frozen, "shard_pieces of frozen unit {}", unit);
  const size_t shard = im.layout_->unit(unit).shard;
  // Master and optimizer state, on the host and on the device, cover the
  // trainable units only, in order.
  const size_t offset = im.layout_->trainable_offset(unit);
  const DType dtype = buffer == 0 ? master_dtype_ : state_dtype_;
  std::array<ShardPiece, 2> pieces;
  if (st.host_numel > 0) {
    // In a swap file the piece has no address (Note [host pieces in a swap file]).
    std::byte* host = im.offload_->buffer(buffer);
    pieces[0] = {host == nullptr ? nullptr : host + offset * elem_size(dtype), dtype, 0, st.host_numel, true};
  }
  pieces[1] = {nullptr, dtype, st.host_numel, shard, false};
  if (st.host_numel < shard) {
    // Device elements are indexed from im.host_numel_ in the owned region.
    const size_t at = (offset + st.host_numel - im.host_numel_) * elem_size(dtype);
    if (buffer > 0) {
      pieces[1].data = im.state_[buffer - 1].as<std::byte>() + at;
    } else if (master_is_params()) {
      pieces[1].data = owned_params(unit) + st.host_numel * elem_size(compute_dtype_);
    } else {
      pieces[1].data = im.master_.as<std::byte>() + at;
    }
  }
  return pieces;
}

namespace {

// n values of src_dtype at src to dst_dtype at dst, ordered on `stream`;
// src_host / dst_host say whether each side is host memory or memory of the
// stream's device. The conversion runs where the source lies (on the host
// for host memory), through a staging copy when the destination is on the
// other side; that case is complete on return.
void convert_across(const Stream& stream, CachingAllocator& allocator, const void* src, DType src_dtype,
                    bool src_host, void* dst, DType dst_dtype, bool dst_host, size_t n) {
  if (n == 0) return;
  if (src_dtype == dst_dtype) return copy_bytes(stream, dst, src, n * elem_size(src_dtype));
  const Stream host = Stream::default_for(Device::host());
  if (stream.device().is_host() || src_host == dst_host) {
    return convert(src_host ? host : stream, src, src_dtype, dst, dst_dtype, n);
  }
  const size_t bytes = n * elem_size(dst_dtype);
  if (src_host) {
    std::vector<std::byte> staged(bytes);
    convert(host, src, src_dtype, staged.data(), dst_dtype, n);
    copy_bytes(stream, dst, staged.data(), bytes);
  } else {
    Buffer staged = allocator.allocate_buffer(bytes, stream, MemoryCategory::kCommBuffers);
    convert(stream, src, src_dtype, staged.data(), dst_dtype, n);
    copy_bytes(stream, dst, staged.data(), bytes);
  }
  stream.synchronize();  // before `staged` goes; the destination is complete
}

}  // namespace

void Engine::Impl::widen_deferred_master(int unit) {
  UnitState& st = state(unit);
  if (!st.master_deferred) return;
  // Deferred only where a load read into the parameters in place, which a
  // shard in a swap file has no address for (shard_in_host_memory).
  ZEST_INTERNAL_ASSERT(!shard_in_swap(unit), "unit {}: a deferred master over parameters in a swap file", unit);
  const size_t bc = elem_size(compute_dtype_);
  const std::byte* params = owned_params(unit);
  for (const ShardPiece& p : stored_shard_pieces(unit, 0)) {
    convert_across(stream_, allocator_, params + p.begin * bc, compute_dtype_, shard_on_host(unit), p.data, p.dtype,
                   p.host, p.end - p.begin);
  }
  stream_.synchronize();
  st.master_deferred = false;
}

void Engine::Impl::widen_deferred_masters() {
  for (int u = 0; u < layout_->num_units(); ++u) widen_deferred_master(u);
}

// Note [shard pieces as fp32]: what checkpoints and the export see of a
// piece is fp32 whatever it keeps (widening bf16 is exact, and narrowing
// back what was widened gives the same bits).
void Engine::Impl::piece_to_fp32(const ShardPiece& p, size_t a, size_t b, float* dst, bool dst_host) {
  ZEST_INTERNAL_ASSERT(p.begin <= a && a <= b && b <= p.end, "[{}, {}) of a piece [{}, {})", a, b, p.begin, p.end);
  convert_across(stream_, allocator_, p.at(a), p.dtype, p.host, dst, DType::kFloat32, dst_host, b - a);
}

void Engine::Impl::piece_from_fp32(const ShardPiece& p, size_t a, size_t b, const float* src, bool src_host) {
  ZEST_INTERNAL_ASSERT(p.begin <= a && a <= b && b <= p.end, "[{}, {}) of a piece [{}, {})", a, b, p.begin, p.end);
  convert_across(stream_, allocator_, src, DType::kFloat32, src_host, p.at(a), p.dtype, p.host, b - a);
}

Engine::Impl::ShardPiece Engine::Impl::staged(int unit, int buffer, const ShardPiece& p, size_t a, size_t b,
                                  std::vector<std::byte>& staging, bool read) {
  if (p.data != nullptr || !p.host || p.begin == p.end) return p;
  ZEST_INTERNAL_ASSERT(p.begin <= a && a <= b && b <= p.end, "[{}, {}) of a piece [{}, {})", a, b, p.begin, p.end);
  staging.resize((b - a) * elem_size(p.dtype));
  const size_t offset = layout_->trainable_offset(unit);
  if (read) offload_->read(buffer, offset + a, offset + b, staging.data());
  return {staging.data(), p.dtype, a, b, true};
}

void Engine::Impl::unstage(int unit, int buffer, const ShardPiece& stored, const ShardPiece& staged) {
  if (stored.data != nullptr || !stored.host || staged.begin == staged.end) return;
  const size_t offset = layout_->trainable_offset(unit);
  offload_->write(buffer, offset + staged.begin, offset + staged.end, staged.data);
}

bool Engine::Impl::shard_on_host(int unit) const {
  return offloads_params() && !units_[static_cast<size_t>(unit)].resident;
}

bool Engine::Impl::shard_in_swap(int unit) const { return param_swap_ && param_swap_->holds(unit); }

// With offload_param a shard is in host memory, which device kernels do not
// touch (Note [offload_param runs with the optimizer on the host]): it comes
// and goes through a device buffer; from a swap file, through host memory
// first.
const std::byte* Engine::Impl::readable_params(int unit, Buffer& temp) {
  if (!shard_on_host(unit)) return owned_params(unit);
  const size_t bytes = layout_->unit(unit).shard * elem_size(compute_dtype_);
  temp = allocator_.allocate_buffer(bytes, stream_, MemoryCategory::kCommBuffers);
  if (shard_in_swap(unit)) {
    // Straight from the pool's buffer, which is the pool's again once the
    // copy is done.
    const ParamSwap::Held values(*param_swap_, unit);
    copy_bytes(stream_, temp.data(), values.bytes().data(), bytes);
    stream_.synchronize();
  } else {
    copy_bytes(stream_, temp.data(), owned_params(unit), bytes);
  }
  return temp.as<std::byte>();
}

void Engine::Impl::narrow_into_shard(int unit, const float* src, size_t at, size_t n, std::byte* scratch) {
  const size_t bc = elem_size(compute_dtype_);
  if (!shard_on_host(unit)) {
    convert(stream_, src, DType::kFloat32, owned_params(unit) + at * bc, compute_dtype_, n);
    return;
  }
  convert(stream_, src, DType::kFloat32, scratch, compute_dtype_, n);
  if (!shard_in_swap(unit)) {
    copy_bytes(stream_, owned_params(unit) + at * bc, scratch, n * bc);
    return;
  }
  std::vector<std::byte> values(n * bc);
  copy_bytes(stream_, values.data(), scratch, n * bc);
  stream_.synchronize();
  // Staged: the caller's operation flushes once the unit's pieces are in
  // (Note [staged shard writes] in param_swap.h).
  param_swap_->write_piece(unit, at, at + n, values.data());
}

// A frozen unit's only buffer: its compute-dtype values, through an fp32
// staging buffer on the engine's device.
void Engine::Impl::frozen_shard(int unit, std::span<float> read, std::span<const float> write) {
  const UnitLayout& U = layout_->unit(unit);
  Buffer staging = allocator_.allocate_buffer(U.shard * 4, stream_, MemoryCategory::kCommBuffers);
  Buffer temp;
  if (!write.empty()) {
    copy_bytes(stream_, staging.data(), write.data(), U.shard * 4);
    if (shard_on_host(unit)) {
      temp = allocator_.allocate_buffer(U.shard * elem_size(compute_dtype_), stream_, MemoryCategory::kCommBuffers);
    }
    narrow_into_shard(unit, staging.as<float>(), 0, U.shard, temp.as<std::byte>());
    if (param_swap_) param_swap_->flush();
  } else {
    convert(stream_, readable_params(unit, temp), compute_dtype_, staging.data(), DType::kFloat32, U.shard);
    copy_bytes(stream_, read.data(), staging.data(), U.shard * 4);
  }
  stream_.synchronize();
}

std::vector<float> Engine::Impl::read_shard(int unit, int buffer) {
  check_finalized("read_shard()");
  settle_offload();
  (void)state(unit);  // checks the index
  std::vector<float> out(layout_->unit(unit).shard);
  if (layout_->unit(unit).frozen) {
    ZEST_CHECK(buffer == 0, "read_shard: unit '{}' is frozen: it has buffer 0 (its values) only, not {}",
               layout_->unit(unit).name, buffer);
    frozen_shard(unit, out, {});
    return out;
  }
  std::array<ShardPiece, 2> pieces = shard_pieces(unit, buffer);
  std::vector<std::byte> staging;
  pieces[0] = staged(unit, buffer, pieces[0], pieces[0].begin, pieces[0].end, staging, /*read=*/true);
  for (const ShardPiece& p : pieces) piece_to_fp32(p, p.begin, p.end, out.data() + p.begin, /*dst_host=*/true);
  stream_.synchronize();
  return out;
}

void Engine::Impl::write_shard(int unit, int buffer, std::span<const float> values) {
  check_finalized("write_shard()");
  settle_offload();
  (void)state(unit);  // checks the index
  const UnitLayout& U = layout_->unit(unit);
  const size_t shard = U.shard;
  ZEST_CHECK(values.size() == shard, "write_shard of unit '{}': {} values for a shard of {}", U.name,
             values.size(), shard);
  for (size_t i = 0; i < shard; ++i) {
    if (std::isfinite(values[i])) continue;
    ZEST_FAIL("write_shard of unit '{}', shard buffer {}: value {} at shard element {} ({}) is not finite; "
              "the shard is left as it was: write finite values",
              U.name, buffer, values[i], i, element_name(U, shard * static_cast<size_t>(partition()) + i));
  }
  if (U.frozen) {
    ZEST_CHECK(buffer == 0, "write_shard: unit '{}' is frozen: it has buffer 0 (its values) only, not {}", U.name,
               buffer);
    frozen_shard(unit, {}, values);
    return;
  }
  std::array<ShardPiece, 2> pieces = shard_pieces(unit, buffer);
  const ShardPiece host = pieces[0];
  std::vector<std::byte> staging;
  pieces[0] = staged(unit, buffer, host, host.begin, host.end, staging, /*read=*/false);
  for (const ShardPiece& p : pieces) piece_from_fp32(p, p.begin, p.end, values.data() + p.begin, /*src_host=*/true);
  stream_.synchronize();
  unstage(unit, buffer, host, pieces[0]);
}

void Engine::Impl::restore_progress(const Progress& progress) {
  check_finalized("restore()");
  Impl& im = *this;
  ZEST_CHECK(im.micro_ == 0 && im.pending_.empty(),
             "restore() in the middle of a gradient accumulation ({} of {} micro-steps done): "
             "restore between optimizer steps",
             im.micro_, config_.accumulation_steps());
  im.applied_ = progress.applied_steps;
  im.skipped_ = progress.skipped_steps;
  im.scaler_.load_state(progress.loss_scaler);
  settle_offload();
  if (progress.lr_override) {
    set_lr(*progress.lr_override);
  } else {
    im.lr_override_.reset();
  }
}

void Engine::Impl::params_from_master(int u) {
  const size_t bc = elem_size(compute_dtype_);
  std::array<ShardPiece, 2> masters = shard_pieces(u, 0);
  std::vector<std::byte> staging;
  masters[0] = staged(u, 0, masters[0], masters[0].begin, masters[0].end, staging, /*read=*/true);
  // A shard in a swap file is narrowed into host memory, then written
  // (offload_param nvme runs at ratio 1: its master is all on the host).
  const bool swapped = shard_in_swap(u);
  std::vector<std::byte> swapped_values(swapped ? layout_->unit(u).shard * bc : 0);
  std::byte* params = swapped ? swapped_values.data() : owned_params(u);
  for (const ShardPiece& m : masters) {
    // On the device the master is the parameters; from the host it is
    // copied (narrowed on the host where it is a copy of its own).
    if (master_is_params() && !m.host) continue;
    convert_across(stream_, allocator_, m.data, m.dtype, m.host, params + m.begin * bc, compute_dtype_,
                   shard_on_host(u), m.end - m.begin);
  }
  if (swapped) {
    stream_.synchronize();
    param_swap_->write(u, 0, swapped_values.size() / bc, swapped_values.data());
  }
}

void Engine::Impl::restore(const Progress& progress) {
  restore_progress(progress);
  Impl& im = *this;
  const ModelLayout& L = *im.layout_;
  for (int u = 0; u < L.num_units(); ++u) {
    if (!L.unit(u).frozen) params_from_master(u);  // write_shard wrote a frozen unit's values
  }
  gather_updated_params(/*frozen_too=*/true);
  stream_.synchronize();
}

}  // namespace zest
