// The memory estimator's model. Policies it mirrors, each from the engine
// file that implements it:
//   layout      layout.cpp: parameters at multiples of kParamAlign, a unit
//               padded to partitions x kShardQuantum, one shard per rank
//   persistent  engine.cpp finalize(): fp32 master and optimizer state over
//               the owned elements; per unit the full parameters (or the
//               shard, stage 3 above the persistence threshold on more
//               than one partition or with offload_param), the full
//               gradients at stages 0-1, an owned-shard accumulator at
//               stages 2-3 or when accumulating (full size under
//               reduce_at_accumulation_boundary)
//   transient   engine_gather.cpp (stage 3 prefetch window, units kept
//               for their reuse: Note [stage-3 reuse distance]),
//               engine_grads.cpp (reduce buckets), engine_step.cpp (norm
//               chunk sums), finalize() (fp32 staging of one unit, at most kInitStagingNumel elements)
// A change to any of these is a change here; tests/engine compares a run's
// measured bytes with this estimate.
#include "zest/estimate/memory_estimate.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "zest/core/check.h"
#include "zest/engine/layout_constants.h"
#include "zest/engine/master_precision.h"
#include "zest/estimate/unit_sizes.h"
#include "zest/optim/exact_sum.h"

namespace zest {
namespace {

// Model-state bytes for units of `full` elements of which a rank owns
// `shard`: instantiated with the padded sizes (exact, integers) and with the
// unpadded ones (Ψ_u and Ψ_u / P, fractions kept) to measure the padding.
template <typename T>
struct StateBytes {
  T params{}, grads{}, master{}, optimizer{};
};

template <typename T>
StateBytes<T> state_bytes(const std::vector<UnitSize>& units, const EstimateOptions& o,
                          bool padded) {
  const T b = static_cast<T>(elem_size(o.compute_dtype));
  // The accumulator of reduced shards is in grad_accum_dtype; the local
  // one (full size) in the compute dtype, which the engine then requires.
  const T acc_b = static_cast<T>(elem_size(o.grad_accum_dtype.value_or(o.compute_dtype)));
  const T states = static_cast<T>(o.optimizer.state_buffers());
  // The master is a copy of its own unless it is the parameters (fp32
  // compute, or bf16 master weights with bf16 compute).
  const bool master = o.master_dtype != o.compute_dtype;
  const T master_b = static_cast<T>(elem_size(o.master_dtype));
  const T state_b = static_cast<T>(elem_size(o.state_dtype));
  const int stage = o.zero.stage;
  // The accumulator: always at stages 2-3 (reduced shards are summed over
  // micro-steps there), at stages 0-1 only when there is more than one.
  const bool acc = stage >= 2 || o.gradient_accumulation_steps > 1;
  // ...full size when the micro-steps are added before they are reduced.
  const bool local = stage <= 1 && o.gradient_accumulation_steps > 1 && o.zero.reduce_at_accumulation_boundary;
  StateBytes<T> s;
  for (const UnitSize& u : units) {
    const T n = static_cast<T>(u.count);
    const T full = static_cast<T>(padded ? u.padded : u.numel);
    const T shard = padded ? static_cast<T>(u.shard)
                           : static_cast<T>(u.numel) / static_cast<T>(o.partitions());
    s.params += n * b * (u.resident ? full : shard);
    if (u.frozen) continue;  // parameters only
    s.grads += n * b * (stage < 2 ? full : T{}) + n * (acc ? (local ? b * full : acc_b * shard) : T{});
    if (master) s.master += n * master_b * shard;
    s.optimizer += n * state_b * states * shard;
  }
  return s;
}

// (padded size, count) of the units `keep` selects, largest first.
template <typename Keep>
std::vector<std::pair<size_t, size_t>> largest_first(const std::vector<UnitSize>& units, Keep keep) {
  std::vector<std::pair<size_t, size_t>> out;
  for (const UnitSize& u : units)
    if (keep(u)) out.emplace_back(u.padded, u.count);
  std::sort(out.begin(), out.end(), std::greater<>());
  return out;
}

struct Taken {
  size_t units = 0;
  size_t numel = 0;
};

Taken take_largest(const std::vector<std::pair<size_t, size_t>>& sizes, size_t k) {
  Taken t;
  for (const auto& [n, c] : sizes) {
    const size_t take = std::min(c, k - t.units);
    t.units += take;
    t.numel += take * n;
    if (t.units == k) break;
  }
  return t;
}

// Stage 3: the unit in use, then the prefetch window of
// Engine::prefetch_after: units while the elements ahead stay within
// stage3_prefetch_bucket_size and all gathered ones within
// stage3_max_live_parameters, stopping at the first that does not fit.
Taken live_units(const std::vector<std::pair<size_t, size_t>>& gathered, const EstimateOptions& o) {
  if (gathered.empty()) return {};
  if (o.live_units > 0) return take_largest(gathered, static_cast<size_t>(o.live_units));
  const auto window = static_cast<size_t>(o.zero.stage3_prefetch_bucket_size);
  const auto max_live = static_cast<size_t>(o.zero.stage3_max_live_parameters);
  Taken t{1, gathered.front().first};
  size_t ahead = 0;
  for (size_t i = 0; i < gathered.size(); ++i) {
    const auto [n, c] = gathered[i];
    const size_t left = i == 0 ? c - 1 : c;
    const size_t by_window = ahead <= window ? (window - ahead) / n : 0;
    const size_t by_live = t.numel <= max_live ? (max_live - t.numel) / n : 0;
    const size_t take = std::min({left, by_window, by_live});
    t.units += take;
    t.numel += take * n;
    ahead += take * n;
    if (take < left) break;
  }
  return t;
}

// Stages 2-3: Engine::grads_done collects units until their elements reach
// reduce_bucket_size; the full gradient buffers of one bucket are alive
// together.
Taken grad_units(const std::vector<std::pair<size_t, size_t>>& all, const EstimateOptions& o) {
  if (o.grad_units_in_flight > 0) return take_largest(all, static_cast<size_t>(o.grad_units_in_flight));
  size_t padded = 0;
  for (const auto& [n, c] : all) padded += n * c;
  const auto bucket = static_cast<size_t>(o.zero.reduce_bucket(padded));
  Taken t;
  for (const auto& [n, c] : all) {
    const size_t to_fill = (bucket - t.numel + n - 1) / n;  // units that reach the bucket
    const size_t take = std::min(c, to_fill);
    t.units += take;
    t.numel += take * n;
    if (t.numel >= bucket) break;
  }
  return t;
}

// Stage 3, Note [stage-3 reuse distance]: the units reuse_kept() keeps from
// forward to backward are all gathered when forward ends (`params`); backward
// then gathers nothing while it goes back through them, releasing each at its
// use while their gradients fill a reduce bucket (grad_units' policy), so the
// most at once (`backward`, parameters and gradients) is the kept units not
// yet released plus the bucket's gradients, at some point of that stretch.
// Exact for the loop reuse_kept() describes; the prefetch window never adds
// to it there (prefetch_after stops at a kept unit).
struct KeptPeak {
  size_t units = 0;
  size_t params = 0;
  size_t backward = 0;
};

KeptPeak kept_peak(const std::vector<UnitSize>& units, const EstimateOptions& o) {
  const std::vector<size_t> kept = reuse_kept(units, o);
  KeptPeak k;
  size_t trainable = 0;
  for (size_t e = 0; e < units.size(); ++e) {
    k.units += kept[e];
    k.params += kept[e] * units[e].padded;
    if (!units[e].frozen) trainable += units[e].count * units[e].padded;
  }
  if (k.units == 0) return k;
  const auto bucket = static_cast<size_t>(o.zero.reduce_bucket(trainable));
  size_t held = k.params;
  size_t pending = 0;
  for (size_t e = units.size(); e-- > 0 && held > 0;) {
    const UnitSize& u = units[e];
    for (size_t c = 0; c < u.count && held > 0; ++c) {
      if (!u.frozen) pending += u.padded;
      k.backward = std::max(k.backward, held + pending);
      if (pending >= bucket) pending = 0;
      if (c < kept[e]) held -= u.padded;  // its last use: released
    }
  }
  return k;
}

int64_t to_bytes(size_t numel, size_t elem_bytes) { return static_cast<int64_t>(numel * elem_bytes); }

// engine/optimizer_offload.cpp: offloaded_numel (ratio of the owned
// elements, a multiple of kParamAlign below 1) and chunk_for (a sixteenth of
// the host part, aligned, within [kParamAlign, 2^22]).
size_t offloaded_numel_of(size_t owned, double ratio) {
  if (ratio >= 1.0) return owned;
  const auto n = static_cast<size_t>(std::floor(ratio * static_cast<double>(owned)));
  return std::min(owned, n / kParamAlign * kParamAlign);
}

size_t offload_chunk_numel(size_t host_numel) {
  if (host_numel == 0) return 0;
  constexpr size_t kMaxChunkNumel = size_t{1} << 22;
  constexpr size_t kMinChunks = 16;
  const size_t per = (host_numel + kMinChunks - 1) / kMinChunks;
  return std::clamp(aligned_param_offset(per), kParamAlign, kMaxChunkNumel);
}

// The host's staging (comm_buffers) of the offload pipeline: two chunk
// slots of gradients and, in 16-bit compute, of parameters; delayed_update
// holds the whole host part's gradients and parameters instead.
int64_t offload_slot_bytes(size_t host_numel, const EstimateOptions& o) {
  if (host_numel == 0) return 0;
  const size_t b = elem_size(o.compute_dtype);
  if (o.offload_optimizer.delayed_update) return to_bytes(2 * host_numel, b);
  // Gradient slots, and parameter slots unless the master is the
  // parameters (copied back as it is, from host memory: from a swap file's
  // ring it goes through the slots too).
  const size_t slots = o.master_dtype == o.compute_dtype && !o.offloads_optimizer_to_nvme() ? 2 : 4;
  return to_bytes(slots * offload_chunk_numel(host_numel), b);
}

// engine/offload_swap.cpp: a record is one chunk's master and state
// buffers, padded to the 4096 bytes the file's records are sized for; the
// file holds two regions of ceil(host / chunk) records.
constexpr size_t kSwapRecordAlignment = 4096;

struct SwapBytes {
  int64_t master = 0;  // both regions' master fields
  int64_t file = 0;    // the file's size
  int64_t record = 0;  // one record: a ring buffer's size
};

SwapBytes offload_swap_bytes(size_t host_numel, const EstimateOptions& o) {
  if (host_numel == 0) return {};
  const size_t chunk = offload_chunk_numel(host_numel);
  const size_t fields = chunk * elem_size(o.master_dtype) +
                        static_cast<size_t>(o.optimizer.state_buffers()) * chunk * elem_size(o.state_dtype);
  const size_t record = (fields + kSwapRecordAlignment - 1) / kSwapRecordAlignment * kSwapRecordAlignment;
  const size_t records = (host_numel + chunk - 1) / chunk;
  return {to_bytes(2 * records * chunk, elem_size(o.master_dtype)), to_bytes(2 * records, record),
          static_cast<int64_t>(record)};
}

// offload_param nvme (engine/detail/param_swap.h, Engine::make_param_swap): the
// trainable shards gathered on demand while they add up to at most
// max_in_cpu stay in host memory; every later one, and every frozen one, is
// in the swap file, two slots of its compute-dtype bytes padded to 4096
// (Note [parameter swap regions]); the pool is buffer_count buffers of the
// largest such shard, padded so, and 4096 bytes to align them.
struct ParamSwapBytes {
  int64_t host = 0;  // the shards left in host memory
  int64_t file = 0;
  int64_t pool = 0;
};

ParamSwapBytes param_swap_bytes(const ModelDescription& model, const std::vector<UnitSize>& units,
                                const EstimateOptions& o) {
  ParamSwapBytes out;
  const size_t b = elem_size(o.compute_dtype);
  const auto slot = [&](size_t shard) { return to_bytes((shard * b + kSwapRecordAlignment - 1) / kSwapRecordAlignment, kSwapRecordAlignment); };
  size_t in_cpu = 0;
  size_t largest = 0;
  for (size_t e = 0; e < units.size(); ++e) {
    const UnitSize& u = units[e];
    if (u.resident) continue;
    for (size_t c = 0; c < u.count; ++c) {
      if (!u.frozen) {
        in_cpu += u.shard;
        if (static_cast<int64_t>(in_cpu) <= o.offload_param.max_in_cpu) {
          out.host += to_bytes(u.shard, b);
          continue;
        }
      }
      ZEST_CHECK(static_cast<int64_t>(u.shard) <= o.offload_param.buffer_size,
                 "offload_param.buffer_size is {} elements, but unit '{}' keeps a shard of {} elements on NVMe, "
                 "which must fit one buffer (the engine refuses it, as DeepSpeed does); set buffer_size to at least "
                 "{}, or raise max_in_cpu",
                 o.offload_param.buffer_size, model.units[e].name, u.shard, u.shard);
      out.file += 2 * slot(u.shard);
      largest = std::max(largest, u.shard);
    }
  }
  if (largest > 0) out.pool = o.offload_param.buffer_count * slot(largest) + static_cast<int64_t>(kSwapRecordAlignment);
  return out;
}

// Parameter bytes of the units stage 3 shards (gathered on demand): what
// offload_param moves to the host.
template <typename T>
T sharded_param_bytes(const std::vector<UnitSize>& units, const EstimateOptions& o, bool padded) {
  T sum{};
  for (const UnitSize& u : units) {
    if (u.resident) continue;
    const T shard = padded ? static_cast<T>(u.shard) : static_cast<T>(u.numel) / static_cast<T>(o.partitions());
    sum += static_cast<T>(u.count) * static_cast<T>(elem_size(o.compute_dtype)) * shard;
  }
  return sum;
}

}  // namespace

MemoryEstimate estimate_memory(const ModelDescription& model, const EstimateOptions& options) {
  model.validate();
  options.validate();
  const EstimateOptions& o = options;
  const std::vector<UnitSize> units = unit_sizes(model, o);
  const size_t b = elem_size(o.compute_dtype);

  MemoryEstimate e;
  e.options = o;
  size_t trainable_owned = 0;  // frozen units have no master or optimizer state
  for (const UnitSize& u : units) {
    e.numel += u.count * u.numel;
    e.padded_numel += u.count * u.padded;
    e.owned_numel += u.count * u.shard;
    trainable_owned += u.frozen ? 0 : u.count * u.shard;
  }

  const StateBytes<int64_t> s = state_bytes<int64_t>(units, o, true);
  const StateBytes<double> bare = state_bytes<double>(units, o, false);
  const auto set = [&](MemoryCategory c, int64_t persistent, int64_t transient) {
    e.by_category[category_index(c)] = {persistent, persistent + transient};
  };
  const auto set_host = [&](MemoryCategory c, int64_t bytes) { e.host_by_category[category_index(c)] = {bytes, bytes}; };

  // What lives on the host. The offloaded master is allocated even where
  // the master is the parameters (then a copy the host update reads and
  // writes).
  const bool master_is_params = o.master_dtype == o.compute_dtype;
  const int states = o.optimizer.state_buffers();
  e.host_numel = o.offloads_optimizer() ? offloaded_numel_of(trainable_owned, o.offload_optimizer.ratio) : 0;
  const int64_t offloaded_master = to_bytes(e.host_numel, elem_size(o.master_dtype));
  const int64_t offloaded_state = to_bytes(e.host_numel * static_cast<size_t>(states), elem_size(o.state_dtype));
  // Device nvme: the master and state are in the swap file, the host keeps
  // the ring (Note [offload swap layout]).
  const bool nvme = o.offloads_optimizer_to_nvme();
  const int64_t host_master = nvme ? 0 : offloaded_master;
  const int64_t host_state = nvme ? 0 : offloaded_state;
  if (nvme) {
    const SwapBytes swap = offload_swap_bytes(e.host_numel, o);
    e.nvme_by_category[category_index(MemoryCategory::kMasterWeights)] = {swap.master, swap.master};
    e.nvme_by_category[category_index(MemoryCategory::kOptimizerState)] = {swap.file - swap.master,
                                                                           swap.file - swap.master};
    e.nvme_bytes = swap.file;
    // The ring's buffer_count records and room to align them, one block of
    // the host allocator's comm_buffers (Note [swap ring in the host
    // allocator]); the engine stages single transfers in the ring.
    e.host_swap_buffer_bytes = o.offload_optimizer.buffer_count * swap.record + kSwapRecordAlignment;
  }
  // Off the device; in host memory all of it with device cpu, with nvme
  // the part max_in_cpu keeps there.
  const int64_t offloaded_params = o.offloads_params() ? sharded_param_bytes<int64_t>(units, o, true) : 0;
  int64_t host_params = offloaded_params;
  if (o.offloads_params() && o.offload_param.device == OffloadDevice::kNvme) {
    const ParamSwapBytes swap = param_swap_bytes(model, units, o);
    host_params = swap.host;
    e.nvme_by_category[category_index(MemoryCategory::kParameters)] = {swap.file, swap.file};
    e.nvme_bytes += swap.file;
    e.host_swap_buffer_bytes += swap.pool;
  }
  const int64_t slots = offload_slot_bytes(e.host_numel, o);
  set_host(MemoryCategory::kParameters, host_params);
  set_host(MemoryCategory::kMasterWeights, host_master);
  set_host(MemoryCategory::kOptimizerState, host_state);
  set_host(MemoryCategory::kCommBuffers, slots + e.host_swap_buffer_bytes);
  e.host_model_state_bytes = host_params + host_master + host_state;
  e.host_peak_bytes = e.host_model_state_bytes + slots + e.host_swap_buffer_bytes;
  const int64_t device_master = master_is_params ? 0 : s.master - offloaded_master;
  const int64_t device_state = s.optimizer - offloaded_state;
  const int64_t device_params = s.params - offloaded_params;
  // The frozen units' part of it, as MemoryReport::frozen_parameters: their
  // shards (full buffers when resident), none that offload_param moved.
  for (const UnitSize& u : units) {
    if (!u.frozen) continue;
    const size_t held = u.resident ? u.padded : (o.offloads_params() ? 0 : u.shard);
    e.frozen_parameter_bytes += to_bytes(u.count * held, b);
  }

  Taken live;
  if (o.zero.stage == 3) {
    live = live_units(largest_first(units, [](const UnitSize& u) { return !u.resident; }), o);
  }
  Taken grads;
  if (o.zero.stage >= 2) grads = grad_units(largest_first(units, [](const UnitSize& u) { return !u.frozen; }), o);
  // The kept units, unless the transients were given (live_units,
  // grad_units_in_flight: the caller's model instead).
  KeptPeak kept;
  if (o.zero.stage == 3 && o.live_units == 0 && o.grad_units_in_flight == 0) kept = kept_peak(units, o);
  e.live_units = std::max(live.units, kept.units);
  e.grad_units_in_flight = grads.units;
  const size_t live_params = std::max(live.numel, kept.params);

  size_t largest = 0;
  for (const UnitSize& u : units) largest = std::max(largest, u.padded);
  // finalize()'s fp32 staging, and with offload_param as much again in the
  // compute dtype (engine.cpp: narrowed on the device for the host shard).
  const int64_t staging = to_bytes(std::min(largest, kInitStagingNumel), 4 + (o.offloads_params() ? b : 0));
  // The chunk sums of this rank's shard and one exact sum (engine_step.cpp):
  // O(shard), whatever the world size.
  const int64_t norm_sums = to_bytes(trainable_owned / kShardQuantum + kExactWords, 8);
  e.norm_bytes = norm_sums;
  // hpZ (Note [hpZ] in config.h): every unit gathered on demand holds its
  // secondary copy, padded / H elements, from its first gather of a step
  // until the step's end.
  int64_t secondary = 0;
  if (const int hpz = o.zero.hpz_group_size(o.world_size); hpz > 0) {
    for (const UnitSize& u : units) {
      if (!u.resident) secondary += to_bytes(u.count * (u.padded / static_cast<size_t>(hpz)), b);
    }
  }
  const int64_t backward = to_bytes(std::max(live.numel + grads.numel, kept.backward), b) + secondary;

  set(MemoryCategory::kParameters, device_params, to_bytes(live_params, b) + secondary);
  set(MemoryCategory::kGradients, s.grads, to_bytes(grads.numel, b));
  set(MemoryCategory::kMasterWeights, device_master, 0);
  set(MemoryCategory::kOptimizerState, device_state, 0);
  set(MemoryCategory::kCommBuffers, 0, std::max(staging, norm_sums));
  e.model_state_bytes = device_params + s.grads + device_master + device_state;
  e.peak_bytes = e.model_state_bytes + std::max({staging, backward, norm_sums});
  e.runtime_reserve_bytes =
      options.runtime_reserve_bytes.value_or(default_runtime_reserve_bytes(options.mesh_size()));

  // The same device states at Ψ' = Ψ, the offloaded fraction taken out.
  const double on_device = trainable_owned == 0 ? 1.0
                                                : static_cast<double>(trainable_owned - e.host_numel) /
                                                      static_cast<double>(trainable_owned);
  const double bare_host_params = o.offloads_params() ? sharded_param_bytes<double>(units, o, false) : 0.0;
  const double bare_device = bare.params - bare_host_params + bare.grads + (bare.master + bare.optimizer) * on_device;
  e.padding_bytes = e.model_state_bytes - std::llround(bare_device);

  e.paper_k = paper_k(o.compute_dtype, o.optimizer, o.master_dtype, o.state_dtype);
  // MiCS: the paper's N is the shard group's size.
  const PaperBytes paper = paper_offload_bytes(static_cast<double>(e.numel), o.zero.shard_group_size(o.world_size),
                                               o.zero.stage, o.offloads_optimizer(), o.offloads_params(), e.paper_k,
                                               static_cast<double>(b), nvme);
  e.paper_bytes = paper.device;
  e.paper_host_bytes = paper.host;
  e.paper_nvme_bytes = paper.nvme;
  return e;
}

double paper_model_bytes(double psi, int world, int stage, double k, double compute_bytes) {
  ZEST_CHECK(world >= 1, "paper_model_bytes: world is {}: it must be at least 1", world);
  ZEST_CHECK(stage >= 0 && stage <= 3, "paper_model_bytes: stage is {}: allowed values are 0, 1, 2 and 3",
             stage);
  const double b = compute_bytes;
  const double n = world;
  switch (stage) {
    case 0: return (2 * b + k) * psi;
    case 1: return 2 * b * psi + k * psi / n;
    case 2: return b * psi + (b + k) * psi / n;
    default: return (2 * b + k) * psi / n;
  }
}

PaperBytes paper_offload_bytes(double psi, int world, int stage, bool optimizer_offload, bool param_offload,
                               double k, double compute_bytes, bool optimizer_nvme) {
  ZEST_CHECK(world >= 1, "paper_offload_bytes: world is {}: it must be at least 1", world);
  ZEST_CHECK(stage >= 0 && stage <= 3, "paper_offload_bytes: stage is {}: allowed values are 0, 1, 2 and 3", stage);
  ZEST_CHECK(!param_offload || stage == 3, "paper_offload_bytes: parameters are offloaded only at stage 3, not {}",
             stage);
  const double b = compute_bytes;
  const double n = partitions_for(stage, world);
  const double params = stage == 3 ? b * psi / n : b * psi;
  const double grads = stage >= 2 ? b * psi / n : b * psi;
  const double optimizer = k * psi / n;
  PaperBytes out;
  out.device = (param_offload ? 0.0 : params) + (optimizer_offload ? 0.0 : grads + optimizer);
  // The host update's fp32 gradients: 4 bytes per owned parameter.
  const double offloaded = optimizer_offload ? optimizer + 4.0 * psi / n : 0.0;
  out.host = (param_offload ? params : 0.0) + (optimizer_nvme ? 0.0 : offloaded);
  out.nvme = optimizer_nvme ? offloaded : 0.0;
  return out;
}

double paper_infinity_nvme_bytes(double psi, int world, double k, double compute_bytes) {
  ZEST_CHECK(world >= 1, "paper_infinity_nvme_bytes: world is {}: it must be at least 1", world);
  return (2 * compute_bytes + k + 4.0) * psi / world;
}

double paper_k(DType compute_dtype, const OptimizerConfig& optimizer, DType master_dtype, DType state_dtype) {
  const auto master = static_cast<double>(elem_size(master_dtype));
  const auto state = static_cast<double>(elem_size(state_dtype));
  return (compute_dtype == DType::kFloat32 ? 0.0 : master) + state * optimizer.state_buffers();
}

size_t largest_fitting_model(int64_t device_bytes, const EstimateOptions& options,
                             const FitOptions& fit) {
  ZEST_CHECK(device_bytes >= 0, "largest_fitting_model: device_bytes is {}: it must be >= 0",
             device_bytes);
  options.validate();
  ZEST_CHECK(fit.host_bytes.value_or(0) >= 0, "largest_fitting_model: host_bytes is {}: it must be >= 0",
             fit.host_bytes.value_or(0));
  ZEST_CHECK(fit.nvme_bytes.value_or(0) >= 0, "largest_fitting_model: nvme_bytes is {}: it must be >= 0",
             fit.nvme_bytes.value_or(0));
  const bool peak = fit.criterion == FitCriterion::kPeak;
  const auto fits = [&](size_t psi) {
    const MemoryEstimate e = estimate_memory(ModelDescription::from_total(psi, fit.unit_numel), options);
    return (peak ? e.peak_bytes + e.runtime_reserve_bytes : e.model_state_bytes) <= device_bytes &&
           (!fit.host_bytes || (peak ? e.host_peak_bytes : e.host_model_state_bytes) <= *fit.host_bytes) &&
           (!fit.nvme_bytes || e.nvme_bytes <= *fit.nvme_bytes);
  };
  if (!fits(1)) return 0;
  // Bounded so that byte counts stay far inside int64 (2^48 parameters of
  // 32 bytes each is 2^53).
  constexpr size_t kMaxParams = size_t{1} << 48;
  size_t lo = 1;
  size_t hi = 2;
  while (fits(hi)) {
    lo = hi;
    if (hi == kMaxParams) return hi;
    hi *= 2;
  }
  // fits(lo) and not fits(hi), whatever lies between.
  while (hi - lo > 1) {
    const size_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

EstimateOptions EstimateOptions::from_config(const EngineConfig& config, int world_size) {
  EstimateOptions o;
  o.world_size = world_size;
  o.zero = config.zero;
  o.compute_dtype = config.compute_dtype();
  o.grad_accum_dtype = config.grad_accum_dtype;
  o.optimizer = config.optimizer;
  o.master_dtype = config.master_dtype();
  o.state_dtype = config.optimizer_state_dtype();
  o.offload_optimizer = config.offload_optimizer;
  o.offload_param = config.offload_param;
  o.tp_size = config.tensor_parallel_size;
  o.pp_size = config.pipeline_stages;
  // The accumulation the engine would take at this world size.
  EngineConfig resolved = config;
  if (world_size >= 1) resolved.resolve_batch(world_size);
  o.gradient_accumulation_steps = resolved.accumulation_steps();
  return o;
}

int64_t default_runtime_reserve_bytes(int world_size) {
  return kCudaContextReserveBytes + (world_size > 1 ? kNcclReserveBytes : 0);
}

void EstimateOptions::validate() const {
  ZEST_CHECK(world_size >= 1, "world_size is {}: it must be at least 1 (the data-parallel ranks)",
             world_size);
  ZEST_CHECK(tp_size >= 1 && pp_size >= 1,
             "tp_size is {} and pp_size {}: each must be at least 1 (1: no tensor or pipeline parallelism)",
             tp_size, pp_size);
  ZEST_CHECK(static_cast<int64_t>(world_size) * tp_size * pp_size <= (int64_t{1} << 20),
             "world_size {} x tp_size {} x pp_size {}: at most 2^20 ranks", world_size, tp_size, pp_size);
  ZEST_CHECK(runtime_reserve_bytes.value_or(0) >= 0,
             "runtime_reserve_bytes is {}: it must be >= 0 (the device bytes of the CUDA context and "
             "NCCL's buffers; leave it unset for the default)",
             runtime_reserve_bytes.value_or(0));
  ZEST_CHECK(zero.stage >= 0 && zero.stage <= 3, "stage is {}: allowed values are 0, 1, 2 and 3",
             zero.stage);
  ZEST_CHECK(compute_dtype == DType::kFloat32 || compute_dtype == DType::kFloat16 ||
                 compute_dtype == DType::kBFloat16,
             "compute dtype is {}: allowed values are fp32, fp16 and bf16", dtype_name(compute_dtype));
  optimizer.validate();
  check_master_precision({compute_dtype, master_dtype, state_dtype, zero.stage, offloads_optimizer(), optimizer.kind,
                          grad_accum_dtype});
  ZEST_CHECK(gradient_accumulation_steps >= 1,
             "gradient_accumulation_steps is {}: it must be at least 1", gradient_accumulation_steps);
  ZEST_CHECK(zero.stage3_param_persistence_threshold >= 0,
             "stage3_param_persistence_threshold is {}: it must be >= 0 (elements)",
             zero.stage3_param_persistence_threshold);
  ZEST_CHECK(zero.reduce_bucket_size.value_or(1) >= 1 && zero.stage3_prefetch_bucket_size >= 0 &&
                 zero.stage3_max_live_parameters >= 0 && zero.stage3_max_reuse_distance >= 0,
             "reduce_bucket_size ({}) must be >= 1, stage3_prefetch_bucket_size ({}), "
             "stage3_max_live_parameters ({}) and stage3_max_reuse_distance ({}) >= 0 (elements)",
             zero.reduce_bucket_size.value_or(1), zero.stage3_prefetch_bucket_size,
             zero.stage3_max_live_parameters, zero.stage3_max_reuse_distance);
  // What the engine refuses (engine.cpp), refused here rather than counted
  // as no offload.
  ZEST_CHECK(offload_param.device != OffloadDevice::kNvme ||
                 (offloads_optimizer_to_nvme() && offload_optimizer.ratio >= 1.0),
             "offload_param (device nvme) goes with offload_optimizer nvme at ratio 1, as in the engine (a step that "
             "fails to write the parameters is undone with the master weights on the drive); this has "
             "offload_optimizer {}, ratio {}",
             offloads_optimizer_to_nvme() ? "nvme" : offloads_optimizer() ? "cpu" : "none", offload_optimizer.ratio);
  ZEST_CHECK(offload_param.device != OffloadDevice::kNvme || offload_param.buffer_count >= 1,
             "offload_param.buffer_count is {}: it must be at least 1 (the parameter swap pool's buffers; "
             "DeepSpeed's default is 5)",
             offload_param.buffer_count);
  ZEST_CHECK(!offloads_optimizer_to_nvme() || !offload_optimizer.delayed_update,
             "offload_optimizer.delayed_update with device \"nvme\" is not supported (the engine refuses it); turn "
             "delayed_update off, or estimate device \"cpu\"");
  ZEST_CHECK(!offloads_optimizer_to_nvme() || offload_optimizer.buffer_count >= 1,
             "offload_optimizer.buffer_count is {}: it must be at least 1 (the swap ring's buffers; DeepSpeed's "
             "default is 4)",
             offload_optimizer.buffer_count);
  ZEST_CHECK(offload_optimizer.ratio >= 0.0 && offload_optimizer.ratio <= 1.0,
             "offload_optimizer.ratio is {}: it must be in [0, 1] (the fraction of the optimizer state offloaded)",
             offload_optimizer.ratio);
  ZEST_CHECK(!offloads_optimizer() || zero.stage >= 1,
             "offload_optimizer (device {}) needs ZeRO stage 1, 2 or 3, as in the engine; this is stage 0: set the "
             "stage, or offload_optimizer.device \"none\"",
             offloads_optimizer_to_nvme() ? "nvme" : "cpu");
  ZEST_CHECK(!offloads_params() || zero.stage == 3,
             "offload_param (device {}) is for stage 3 only, as in DeepSpeed; this is stage {}",
             offload_param.device == OffloadDevice::kNvme ? "nvme" : "cpu", zero.stage);
  ZEST_CHECK(!offloads_params() || carries_offloaded_params(offload_optimizer),
             "offload_param (device cpu) goes with offload_optimizer cpu at ratio 1, as in the engine (its host "
             "optimizer writes the offloaded parameters); this has offload_optimizer {}, ratio {}",
             offloads_optimizer() ? "cpu" : "none", offload_optimizer.ratio);
  zero.check_mics(world_size, offloads_optimizer());
  zero.check_hpz(world_size, offloads_params());
  ZEST_CHECK(live_units >= 0 && grad_units_in_flight >= 0,
             "live_units ({}) and grad_units_in_flight ({}) must be >= 0 (0: the engine's policy)",
             live_units, grad_units_in_flight);
}

}  // namespace zest
