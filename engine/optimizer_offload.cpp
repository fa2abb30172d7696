#include "zest/engine/detail/optimizer_offload.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "zest/core/check.h"
#include "zest/core/logging.h"
#include "zest/engine/layout_constants.h"
#include "zest/memory/copy.h"

namespace zest {
namespace {

// At most this many elements per chunk (16 MiB of fp32 state per buffer),
// and at least 16 chunks where the host part allows, so that filling and
// draining the pipeline (one chunk's copy at each end) is a small part of it.
constexpr size_t kMaxChunkNumel = size_t{1} << 22;
constexpr size_t kMinChunks = 16;

size_t chunk_for(size_t host_numel) {
  if (host_numel == 0) return 0;
  const size_t per = (host_numel + kMinChunks - 1) / kMinChunks;
  const size_t aligned = (per + kParamAlign - 1) / kParamAlign * kParamAlign;
  return std::clamp(aligned, kParamAlign, kMaxChunkNumel);
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

size_t offloaded_numel(size_t owned, double ratio) {
  ZEST_CHECK(ratio >= 0.0 && ratio <= 1.0,
             "zero_optimization.offload_optimizer.ratio is {}: it must be in [0, 1] (the fraction of "
             "the optimizer state kept in host memory; 1 offloads all of it)",
             ratio);
  if (ratio >= 1.0) return owned;
  const auto n = static_cast<size_t>(std::floor(ratio * static_cast<double>(owned)));
  return std::min(owned, n / kParamAlign * kParamAlign);
}

OptimizerOffload::OptimizerOffload(CachingAllocator& host, Device device, size_t host_numel, int state_buffers,
                                   OffloadDtypes dtypes, bool delayed, const OffloadSwapConfig* swap)
    : host_numel_(host_numel),
      state_buffers_(state_buffers),
      dtypes_(dtypes),
      chunk_(chunk_for(host_numel)),
      delayed_(delayed),
      d2h_(device, /*timing=*/true),
      h2d_(device, /*timing=*/true) {
  ZEST_CHECK(host.device().is_host(),
             "offload_optimizer: the host allocator allocates memory of {}; it must allocate host "
             "memory (make_host_allocator or make_cuda_pinned_allocator)",
             host.device().str());
  ZEST_INTERNAL_ASSERT(state_buffers >= 0 && state_buffers <= 2, "{} optimizer state buffers", state_buffers);
  ZEST_INTERNAL_ASSERT(swap == nullptr || !delayed, "a delayed update of a host part in a swap file");
  if (host_numel == 0) return;
  const Stream hs = Stream::default_for(Device::host());
  const DType compute = dtypes.compute;
  if (swap != nullptr) {
    swap_ = std::make_unique<OffloadSwap>(*swap, host, host_numel, chunk_, state_buffers, dtypes.master, dtypes.state);
  } else {
    master_ = host.allocate_buffer(host_numel * elem_size(dtypes.master), hs, MemoryCategory::kMasterWeights);
    for (int s = 0; s < state_buffers; ++s) {
      const size_t bytes = host_numel * elem_size(dtypes.state);
      state_[s] = host.allocate_buffer(bytes, hs, MemoryCategory::kOptimizerState);
      fill_zero(hs, state_[s].data(), bytes);
    }
  }
  if (delayed) {
    grads_all_ = host.allocate_buffer(host_numel * elem_size(compute), hs, MemoryCategory::kCommBuffers);
    params_all_ = host.allocate_buffer(host_numel * elem_size(compute), hs, MemoryCategory::kCommBuffers);
    return;
  }
  const size_t slot_bytes = chunk_ * elem_size(compute);
  for (int i = 0; i < 2; ++i) {
    grad_slot_[i] = host.allocate_buffer(slot_bytes, hs, MemoryCategory::kCommBuffers);
    // The master in the parameters' dtype is copied back from where it lies
    // in host memory; from a swap file's ring it goes through the slots.
    if (!params_from_master()) param_slot_[i] = host.allocate_buffer(slot_bytes, hs, MemoryCategory::kCommBuffers);
  }
}

OptimizerOffload::~OptimizerOffload() {
  try {
    join_update();
  } catch (const std::exception&) {
    ZEST_LOG_WARN("offload_optimizer teardown: the delayed update failed: {}", current_exception_text());
  }
}

std::byte* OptimizerOffload::buffer(int b) const {
  ZEST_INTERNAL_ASSERT(b >= 0 && b <= state_buffers_, "offload buffer {} of {}", b, state_buffers_ + 1);
  if (swap_) return nullptr;
  return b == 0 ? master_.as<std::byte>() : state_[b - 1].as<std::byte>();
}

void OptimizerOffload::read(int buf, size_t a, size_t b, std::byte* out) const {
  if (swap_) return swap_->read(buf, a, b, out);
  const size_t e = elem_size(buf == 0 ? dtypes_.master : dtypes_.state);
  std::memcpy(out, buffer(buf) + a * e, (b - a) * e);
}

void OptimizerOffload::write(int buf, size_t a, size_t b, const std::byte* in) {
  if (swap_) return swap_->write(buf, a, b, in);
  const size_t e = elem_size(buf == 0 ? dtypes_.master : dtypes_.state);
  std::memcpy(buffer(buf) + a * e, in, (b - a) * e);
}

OptimizerOffload::HostSpan OptimizerOffload::in_memory() const {
  HostSpan h;
  for (int b = 0; b <= state_buffers_; ++b) h.at[static_cast<size_t>(b)] = buffer(b);
  return h;
}

void OptimizerOffload::pieces_of(size_t a, size_t b, std::span<const OffloadUnit> units, size_t& cursor,
                                 std::vector<Piece>& out) const {
  out.clear();
  for (size_t u = cursor; u < units.size(); ++u) {
    const OffloadUnit& unit = units[u];
    const size_t lo = std::max(a, unit.offset);
    const size_t hi = std::min(b, unit.offset + unit.host_numel);
    if (unit.offset >= b) break;
    if (lo < hi) out.push_back({lo, hi, &unit});
    // A unit that ends inside this chunk is not in the next one.
    if (unit.offset + unit.host_numel <= b) cursor = u + 1;
  }
}

void OptimizerOffload::update(const std::vector<Piece>& pieces, const OptimizerConfig& config,
                              std::span<const float> group_decay, StepScalars scalars, const std::byte* grads,
                              std::byte* params, size_t base, const HostSpan& host) {
  const Stream hs = Stream::default_for(Device::host());
  const size_t bc = elem_size(dtypes_.compute);
  for (const Piece& p : pieces) {
    const size_t off = p.unit->offset;
    for (const GroupRun& run : *p.unit->runs) {
      const size_t lo = std::max(run.begin + off, p.begin);
      const size_t hi = std::min(run.end + off, p.end);
      if (lo >= hi) continue;
      ShardBuffers b;
      b.master = host.at[0] + (lo - host.first) * elem_size(dtypes_.master);
      b.master_dtype = dtypes_.master;
      for (int s = 0; s < state_buffers_; ++s) {
        b.state[s] = host.at[static_cast<size_t>(s) + 1] + (lo - host.first) * elem_size(dtypes_.state);
      }
      b.state_dtype = dtypes_.state;
      b.grad = grads + (lo - base) * bc;
      b.grad_dtype = dtypes_.compute;
      b.param_dtype = dtypes_.compute;
      b.numel = hi - lo;
      scalars.weight_decay = group_decay[static_cast<size_t>(run.group)];
      // bf16 master weights are the parameters (no output of their own):
      // the delayed update's copy of them is the master's bytes.
      const bool copy_master = params != nullptr && dtypes_.master != DType::kFloat32;
      if (params != nullptr && !copy_master) b.param_out = params + (lo - base) * bc;
      optimizer_step(hs, config, b, scalars);
      if (copy_master) copy_bytes(hs, params + (lo - base) * bc, b.master, b.numel * bc);
    }
  }
}

void OptimizerOffload::step(const Stream& compute, const OptimizerConfig& config, std::span<const OffloadUnit> units,
                            std::span<const float> group_decay, StepScalars scalars) {
  if (host_numel_ == 0) return;
  const auto start = std::chrono::steady_clock::now();
  try {
    if (delayed_) {
      delayed_step(compute, config, units, group_decay, scalars);
    } else {
      pipelined_step(compute, config, units, group_decay, scalars);
    }
  } catch (...) {
    // No copy may be left touching the slots or the state.
    for (CopyQueue* q : {&d2h_, &h2d_}) {
      try {
        q->synchronize();
      } catch (const std::exception&) {
        ZEST_LOG_WARN("offload_optimizer: after a failed step: {}", current_exception_text());
      }
    }
    throw;
  }
  times_.total_ms += ms_since(start);
  times_.d2h_ms += d2h_.take_busy_ms();
  times_.h2d_ms += h2d_.take_busy_ms();
}

void OptimizerOffload::pipelined_step(const Stream& compute, const OptimizerConfig& config,
                                      std::span<const OffloadUnit> units, std::span<const float> group_decay,
                                      StepScalars scalars) {
  const size_t bc = elem_size(dtypes_.compute);
  const size_t chunks = (host_numel_ + chunk_ - 1) / chunk_;

  std::vector<std::vector<Piece>> pieces(chunks);
  size_t cursor = 0;
  for (size_t i = 0; i < chunks; ++i) pieces_of(i * chunk_, std::min(host_numel_, (i + 1) * chunk_), units, cursor, pieces[i]);

  std::vector<CopyQueue::Mark> fetched(chunks), stored(chunks);
  const auto fetch = [&](size_t i) {
    std::byte* slot = grad_slot_[i % 2].as<std::byte>();
    const size_t a = i * chunk_;
    for (const Piece& p : pieces[i]) {
      d2h_.copy(slot + (p.begin - a) * bc, p.unit->grad + (p.begin - p.unit->offset) * bc, (p.end - p.begin) * bc);
    }
    fetched[i] = d2h_.mark();
  };
  const auto store = [&](size_t i) {
    const size_t a = i * chunk_;
    for (const Piece& p : pieces[i]) {
      const void* src = params_from_master() ? static_cast<const void*>(master_.as<std::byte>() + p.begin * bc)
                             : static_cast<const void*>(param_slot_[i % 2].as<std::byte>() + (p.begin - a) * bc);
      if (p.unit->put) {
        // Host memory already, complete: update(i) wrote it on this thread.
        p.unit->put(p.begin - p.unit->offset, static_cast<const std::byte*>(src), p.end - p.begin);
        continue;
      }
      h2d_.copy(p.unit->params + (p.begin - p.unit->offset) * bc, src, (p.end - p.begin) * bc);
    }
    stored[i] = h2d_.mark();
  };

  const auto run = [&](size_t i, const HostSpan& host) {
    d2h_.synchronize(fetched[i]);
    // The slot's parameters from two chunks ago have left.
    if (i >= 2 && !params_from_master()) h2d_.synchronize(stored[i - 2]);
    const auto t = std::chrono::steady_clock::now();
    update(pieces[i], config, group_decay, scalars, grad_slot_[i % 2].as<std::byte>(),
           params_from_master() ? nullptr : param_slot_[i % 2].as<std::byte>(), i * chunk_, host);
    times_.update_ms += ms_since(t);
    store(i);
    if (i + 2 < chunks) fetch(i + 2);  // into the slot update(i) has finished reading
  };

  d2h_.wait_for(compute);  // the reduced gradients are complete
  for (size_t i = 0; i < std::min<size_t>(2, chunks); ++i) fetch(i);
  if (swap_) {
    // Each chunk's master and state as the ring holds them.
    swap_->update([&](size_t i, const OffloadSwap::Chunk& at) { run(i, HostSpan{at, i * chunk_}); });
    const SwapRingTimes& io = swap_->times();
    times_.read_wait_ms += 1e3 * io.wait_read;
    times_.write_wait_ms += 1e3 * io.wait_write;
    times_.chunk_ms += 1e3 * io.compute;
    times_.chunk_overlapped_ms += 1e3 * io.compute_overlapped;
  } else {
    const HostSpan host = in_memory();
    for (size_t i = 0; i < chunks; ++i) run(i, host);
  }
  h2d_.join(compute);
  // Every copy done: the host memory is quiet between steps (checkpoints
  // read it; the next step's update writes it).
  h2d_.synchronize();
}

void OptimizerOffload::join_update() {
  if (!update_thread_.joinable()) return;
  update_thread_.join();
  times_.update_ms += std::exchange(update_thread_ms_, 0.0);
  if (update_error_) {
    in_flight_ = false;
    std::rethrow_exception(std::exchange(update_error_, nullptr));
  }
}

void OptimizerOffload::delayed_step(const Stream& compute, const OptimizerConfig& config,
                                    std::span<const OffloadUnit> units, std::span<const float> group_decay,
                                    StepScalars scalars) {
  const size_t bc = elem_size(dtypes_.compute);
  for (const OffloadUnit& u : units) ZEST_INTERNAL_ASSERT(!u.put, "a delayed update of parameters in a swap file");
  // The previous step's update has had the forward and backward to run in.
  join_update();
  delayed_units_.assign(units.begin(), units.end());
  size_t cursor = 0;
  pieces_of(0, host_numel_, delayed_units_, cursor, delayed_pieces_);
  // This step's gradients in, the previous update's parameters out, at once.
  d2h_.wait_for(compute);
  for (const Piece& p : delayed_pieces_) {
    d2h_.copy(grads_all_.as<std::byte>() + p.begin * bc, p.unit->grad + (p.begin - p.unit->offset) * bc,
              (p.end - p.begin) * bc);
  }
  if (in_flight_) {
    // The parameters may still be read by work queued on `compute` (this
    // step's backward, on a GPU): the copies that overwrite them wait for it.
    h2d_.wait_for(compute);
    for (const Piece& p : delayed_pieces_) {
      h2d_.copy(p.unit->params + (p.begin - p.unit->offset) * bc, params_all_.as<std::byte>() + p.begin * bc,
                (p.end - p.begin) * bc);
    }
    h2d_.join(compute);
  }
  d2h_.synchronize();
  h2d_.synchronize();  // params_all_ is the new update's to write
  in_flight_ = true;
  // By value: the caller's config and decay may be gone before the thread is.
  update_thread_ = std::thread([this, c = config, decay = std::vector<float>(group_decay.begin(), group_decay.end()),
                                scalars] {
    const auto t = std::chrono::steady_clock::now();
    try {
      update(delayed_pieces_, c, decay, scalars, grads_all_.as<std::byte>(), params_all_.as<std::byte>(), 0,
             in_memory());
    } catch (...) {
      update_error_ = std::current_exception();
    }
    update_thread_ms_ = ms_since(t);
  });
}

void OptimizerOffload::settle(const Stream& compute) {
  if (!delayed_ || !in_flight_) return;
  join_update();
  const size_t bc = elem_size(dtypes_.compute);
  h2d_.wait_for(compute);  // as in delayed_step: readers queued on `compute` first
  for (const Piece& p : delayed_pieces_) {
    h2d_.copy(p.unit->params + (p.begin - p.unit->offset) * bc, params_all_.as<std::byte>() + p.begin * bc,
              (p.end - p.begin) * bc);
  }
  h2d_.join(compute);
  h2d_.synchronize();
  in_flight_ = false;
}

void OptimizerOffload::roll_back() {
  ZEST_INTERNAL_ASSERT(swap_ != nullptr, "offload_optimizer: a roll back of a host part in host memory");
  swap_->roll_back();
}

OffloadTimes OptimizerOffload::take_times() { return std::exchange(times_, OffloadTimes{}); }

}  // namespace zest
