// Per-rank memory of a model under each ZeRO stage, before running it: the
// bytes the engine will allocate, category by category, computed from the
// same layout rules (layout_constants.h) and the same allocation policy, so
// that Engine::memory_report() of a run measures what this estimates.
//
//   // zest-example: run
//   zest::ModelDescription model = zest::ModelDescription::from_total(7'500'000'000);
//   zest::EstimateOptions opt;
//   opt.world_size = 64;
//   opt.zero.stage = 3;
//   zest::MemoryEstimate e = zest::estimate_memory(model, opt);
//   // 16 bytes x 7.5e9 / 64 ranks, the ZeRO paper's 1.875e9, plus padding:
//   ZEST_CHECK(e.model_state_bytes >= 1'875'000'000 && e.model_state_bytes < 1'876'000'000, "per rank");
//   std::puts(zest::format_estimate_table(model, opt).c_str());  // every stage
//
// What is counted (requested bytes, as the allocator's category stats count
// them; its rounding to 512 B and its cached segments are not):
//   persistent  parameters, gradients (incl. the accumulator), master
//               weights and optimizer state (fp32, or bf16), from finalize() on
//   transient   stage 3: gathered full parameters of the live units, and
//               with hpZ every gathered unit's secondary copy (padded / H);
//               stages 2-3: full gradient buffers waiting for their
//               reduce-scatter; finalize()'s fp32 staging of one unit
//               (with offload_param, and its compute-dtype copy) and the
//               gradient-norm chunk sums of step() (comm_buffers)
// The user's activations and workspace are not.
//
// Host memory is counted apart, by the same categories (MemoryReport's
// host_by_category measures it): with offload_optimizer (device cpu, what
// the engine runs) the offloaded part of each rank's fp32 master weights and
// optimizer state (ratio of the owned elements, engine/detail/optimizer_offload.h)
// and the copies' staging slots (comm_buffers); with offload_param at stage
// 3 (which the engine runs with all of the optimizer offloaded), the
// parameter shards of the gathered units, which then reach the device only
// while gathered. Gradients stay on the device: ZEST streams them to the
// host update in chunks, where DeepSpeed keeps an fp32 copy on the host
// (paper_offload_bytes gives that published accounting).
//
// NVMe is the third tier (MemoryReport::nvme_by_category measures it): with
// offload_optimizer device nvme the offloaded master weights and optimizer
// state are in one swap file per rank (engine/detail/offload_swap.h), whose bytes
// are counted exactly as the engine sizes the file: records of one pipeline
// chunk (master, then each state buffer) padded to 4096 bytes, two regions
// of them (Note [offload swap regions]). The host then keeps the copies'
// slots and the swap ring's aligned buffers, buffer_count records and 4096
// bytes to align them (host_swap_buffer_bytes), both in the host
// allocator's comm_buffers. With offload_param device nvme (which the
// engine runs with offload_optimizer nvme) the parameter shards past
// max_in_cpu, and the frozen ones, are in a second swap file per rank
// (engine/detail/param_swap.h): kParameters of nvme_by_category, two slots of each
// shard padded to 4096 bytes; its pool of buffer_count buffers of the
// largest such shard (and 4096 bytes to align them) is in
// host_swap_buffer_bytes too.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zest/core/dtype.h"
#include "zest/config/config.h"
#include "zest/engine/layout_constants.h"
#include "zest/memory/memory_category.h"
#include "zest/optim/optimizer.h"

namespace zest {

// The most parameters a description may hold: the estimator keeps bytes in
// int64, and 2^48 elements of up to 32 bytes each stay below 2^53, where
// doubles (the padding measure, the overflow checks) are still exact.
inline constexpr double kMaxModelNumel = static_cast<double>(size_t{1} << 48);

// One unit (a layer or block: what the engine gathers and reduces as one
// flat buffer), `count` times over.
struct UnitDescription {
  std::string name;
  // In the order the engine lays them out (registration order within a
  // parameter group, groups in declaration order), each >= 1 element.
  std::vector<size_t> param_numels;
  size_t count = 1;  // identical units, e.g. 48 transformer blocks
  bool frozen = false;  // parameters only: no gradients, master or optimizer state

  size_t numel() const;  // parameters of one unit, without alignment
};

struct ModelDescription {
  std::vector<UnitDescription> units;
  // Set by from_total(): only a parameter count was given, so the unit sizes
  // (which decide padding and the transients) are assumed, not known.
  bool total_only = false;

  // `numel` parameters as units of `unit_numel` (the last one smaller), or
  // as one unit when unit_numel is 0. Each unit holds a single parameter.
  static ModelDescription from_total(size_t numel, size_t unit_numel = 0);

  size_t numel() const;               // Ψ: every parameter of every unit
  size_t num_units() const;           // counting repeats
  size_t largest_unit_numel() const;
  // "7,500,000,000 parameters in 1 unit (only a total was given: treated as one unit)"
  std::string summary() const;
  // Non-empty, every unit named and non-empty, every count and numel >= 1.
  void validate() const;
};

// Units, one per line: "name numel [numel...]" ('#' starts a comment), or a
// JSON list whose items are lists of numels or objects
// {"name": ..., "params": [numel, ...], "count": n, "frozen": true} (count
// and frozen optional). Errors name the line or item and what was expected.
ModelDescription parse_model_description(std::string_view text);

struct EstimateOptions {
  // The data-parallel ranks ZeRO shards over.
  int world_size = 1;
  // The device mesh around them: world_size x tp_size x pp_size ranks.
  // estimate_memory counts the units it is given, one rank's (a model
  // split by tp and pp is described as a rank of one stage holds it), and
  // takes the mesh for its runtime reserve only; estimate_mesh_memory
  // (mesh_estimate.h) splits a transformer by them.
  int tp_size = 1;
  int pp_size = 1;
  // stage, mics_shard_size (MiCS: at stage 3 the model states are sharded
  // over groups of that many ranks, so the per-rank bytes are those of a
  // world of mics_shard_size ranks), zero_hpz_partition_size (hpZ: the
  // secondary copies of the parameters, a transient of stage 3), stage3_param_persistence_threshold, reduce_bucket_size,
  // stage3_prefetch_bucket_size and stage3_max_live_parameters, with the
  // engine's (DeepSpeed's) defaults and meaning.
  ZeroConfig zero;
  DType compute_dtype = DType::kFloat16;  // the paper's mixed precision
  // data_types.grad_accum_dtype: the accumulator's dtype; unset, the
  // compute dtype (as the engine takes it).
  std::optional<DType> grad_accum_dtype;
  OptimizerConfig optimizer;              // kind and momentum: state buffers
  // What master weights and optimizer state are kept in (DeepSpeed's
  // bf16_master_weights_and_grads, bf16_optimizer_states): fp32, or bf16,
  // under the engine's rules (bf16 master weights are the bf16 parameters).
  DType master_dtype = DType::kFloat32;
  DType state_dtype = DType::kFloat32;
  int64_t gradient_accumulation_steps = 1;
  // device, ratio, delayed_update and (device nvme) buffer_count are used
  // (pin_memory and nvme_path do not change the bytes); offload_param:
  // device, at stage 3, and (device nvme) buffer_count, buffer_size and
  // max_in_cpu.
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
  // Overrides of the transient model; 0 derives them from the engine's
  // policy (see estimate_memory). Useful when the loop holds several units
  // gathered at once, or to reproduce a simpler model.
  int live_units = 0;            // stage 3: full parameter buffers at once
  int grad_units_in_flight = 0;  // stages 2-3: full gradient buffers at once
  // Device bytes outside the engine's allocator (Note [runtime reserve]);
  // unset, default_runtime_reserve_bytes(mesh_size()).
  std::optional<int64_t> runtime_reserve_bytes;

  // The options of a run of `config` on `world_size` data-parallel ranks,
  // the mesh's tp and pp from the file (tensor_parallel_size,
  // pipeline_stages).
  static EstimateOptions from_config(const EngineConfig& config, int world_size);
  // Throws a zest::Error naming the bad field and the allowed values.
  void validate() const;
  // Every rank of the mesh: world_size x tp_size x pp_size.
  int mesh_size() const { return world_size * tp_size * pp_size; }
  // 1 at stage 0, the world size at stages 1-3.
  // With MiCS (zero.mics_shard_size at stage 3) the shard group's size.
  int partitions() const { return partitions_for(zero.stage, zero.shard_group_size(world_size)); }
  // Device cpu or nvme: the owned master weights and state leave the device.
  bool offloads_optimizer() const { return offload_optimizer.device != OffloadDevice::kNone; }
  bool offloads_optimizer_to_nvme() const { return offload_optimizer.device == OffloadDevice::kNvme; }
  bool offloads_params() const { return offload_param.device != OffloadDevice::kNone; }
};

// Note [runtime reserve]. Device memory that a rank needs besides what the
// engine allocates, which no category counts and MemoryReport does not see:
//   the CUDA context   the driver's per-process state and the loaded
//                      kernels of ZEST, cuBLAS and the user's code: about
//                      300-600 MiB on Hopper with CUDA 12's lazy loading
//                      (CUDA_MODULE_LOADING=LAZY, the default since 12.2);
//                      kCudaContextReserveBytes is 512 MiB;
//   NCCL's buffers     per channel and peer, NCCL_BUFFSIZE (4 MiB) for the
//                      Simple protocol plus the LL and LL128 buffers, for
//                      the ring's two peers and the tree's, on up to 32
//                      channels, and NVLS's buffers on NVSwitch systems
//                      (H100/H200 HGX): hundreds of MiB to over a GiB with
//                      NCCL's defaults (NCCL's user guide, environment
//                      variables NCCL_BUFFSIZE, NCCL_NCHANNELS_PER_NET_PEER,
//                      NCCL_NVLS_ENABLE); kNcclReserveBytes is 1 GiB, for a
//                      world of more than one rank.
// ZEST has NCCL allocate its buffers at creation, before the engine's
// (nccl_comm.cpp, Note [eager NCCL buffers]), so what remains for the model
// is the device's memory less this reserve; largest_fitting_model's peak
// criterion counts it. A run that measured its own (free memory before and
// after creating the communicator) passes it in
// EstimateOptions::runtime_reserve_bytes.
inline constexpr int64_t kCudaContextReserveBytes = int64_t{512} << 20;
inline constexpr int64_t kNcclReserveBytes = int64_t{1} << 30;
int64_t default_runtime_reserve_bytes(int world_size);

struct CategoryEstimate {
  int64_t persistent = 0;  // bytes held from finalize() on
  int64_t peak = 0;        // persistent plus this category's transient
};

struct MemoryEstimate {
  EstimateOptions options;
  size_t numel = 0;         // Ψ
  size_t padded_numel = 0;  // Σ padded_u: Ψ with alignment and shard padding
  size_t owned_numel = 0;   // Σ s_u: the elements one rank owns
  size_t live_units = 0;            // as modelled (stage 3, else 0)
  size_t grad_units_in_flight = 0;  // as modelled (stages 2-3, else 0)

  // Device bytes per rank by category (offloaded state is not here).
  std::array<CategoryEstimate, kNumMemoryCategories> by_category{};
  // Host bytes per rank by category: all zero without offload.
  std::array<CategoryEstimate, kNumMemoryCategories> host_by_category{};
  size_t host_numel = 0;  // owned elements whose master and state are offloaded (host or NVMe)
  // NVMe bytes per rank by category (offload_optimizer device nvme): the
  // swap file's master weights (kMasterWeights) and the rest of it, the
  // state buffers and the records' alignment padding (kOptimizerState),
  // both regions; with offload_param nvme the parameter swap file
  // (kParameters); all zero otherwise.
  std::array<CategoryEstimate, kNumMemoryCategories> nvme_by_category{};
  int64_t nvme_bytes = 0;  // the swap files' size: the sum of nvme_by_category
  // Host bytes of the swap ring (device nvme): buffer_count records and
  // 4096 bytes to align them, and the parameter swap pool's, of the host's
  // comm_buffers (what MemoryReport::host_swap_buffers measures).
  int64_t host_swap_buffer_bytes = 0;
  // Persistent parameters + gradients + master weights + optimizer state
  // (what MemoryReport::model_states() measures).
  int64_t model_state_bytes = 0;
  // Of kParameters' persistent device bytes, those of frozen units (what
  // MemoryReport::frozen_parameters measures); the rest are trainable.
  int64_t frozen_parameter_bytes = 0;
  // An upper bound of the device bytes in use at any time: model states
  // plus the largest of the phases' transients (finalize's staging, a
  // backward's live parameters and gradients, step's norm sums). Exact when
  // the largest unit is the last one registered.
  int64_t peak_bytes = 0;
  // Note [runtime reserve]: the CUDA context and NCCL's buffers, on top of
  // peak_bytes (EstimateOptions::runtime_reserve_bytes, or its default).
  int64_t runtime_reserve_bytes = 0;
  // Host: persistent parameters, master weights and optimizer state (what
  // MemoryReport::host_model_states() measures), and with the staging slots
  // and the swap ring at their peak.
  int64_t host_model_state_bytes = 0;
  int64_t host_peak_bytes = 0;
  // step()'s gradient-norm workspace (comm_buffers while step() runs): one
  // double per 256 owned elements and one exact sum (optim/grad_norm.h), so
  // O(shard): it shrinks with the world size.
  int64_t norm_bytes = 0;
  // model_state_bytes minus the same model states without alignment and
  // shard padding (Ψ/N elements per rank, fractions included).
  int64_t padding_bytes = 0;
  // The ZeRO paper's formula at Ψ, with K and b as the options imply, and
  // the K used; with offload, the published device and host figures of
  // paper_offload_bytes.
  double paper_bytes = 0.0;
  double paper_host_bytes = 0.0;
  double paper_nvme_bytes = 0.0;
  double paper_k = 0.0;

  const CategoryEstimate& operator[](MemoryCategory c) const {
    return by_category[category_index(c)];
  }
  const CategoryEstimate& host(MemoryCategory c) const { return host_by_category[category_index(c)]; }
  const CategoryEstimate& nvme(MemoryCategory c) const { return nvme_by_category[category_index(c)]; }
};

// Per-rank bytes of `model` under `options`. The model layout is the
// engine's: see layout_constants.h.
//
// Transients, by default from the engine's policy (exact when the units
// are of one size; a good approximation otherwise, taking the largest units):
//   live units   the unit in use plus the ones prefetched after it, up to
//                stage3_prefetch_bucket_size elements ahead and
//                stage3_max_live_parameters in all (units at or below the
//                persistence threshold are resident, not gathered); or,
//                when more, the units stage3_max_reuse_distance keeps
//                gathered from forward to backward (reuse_kept in
//                unit_sizes.h), all held as forward ends
//   grad units   units whose full gradients are kept until their bucket
//                reaches reduce_bucket_size elements, then reduce-scattered
MemoryEstimate estimate_memory(const ModelDescription& model, const EstimateOptions& options);

// The ZeRO paper's per-rank model-state bytes for Ψ = psi parameters on
// `world` ranks, K bytes of optimizer state per parameter and b bytes per
// compute-dtype element (2 in the paper):
//   stage 0  (2b + K)Ψ        stage 2  bΨ + (b + K)Ψ/N
//   stage 1  2bΨ + KΨ/N       stage 3  (2b + K)Ψ/N
double paper_model_bytes(double psi, int world, int stage, double k = 12.0,
                         double compute_bytes = 2.0);
// Per-rank model-state bytes as the offload papers and DeepSpeed count them
// (its estimate_zero2/zero3_model_states_mem_needs, without their 1.5 buffer
// factor): every parameter's fp32 master, optimizer state and fp32 gradient
// for the host update, K + 4 bytes, on the host, divided over the N ranks at
// stages 1-3; the b-byte parameters on the device (whole at stages 1-2, Ψ/N
// at 3), or with param_offload (stage 3) on the host too; b-byte gradients
// are passed through to the host, not held. Without offload_optimizer, the
// ZeRO formula on the device and nothing on the host. At K = 12, b = 2:
//   stages 1-2 + optimizer offload  device 2Ψ      host 16Ψ/N
//   stage 3 + optimizer offload     device 2Ψ/N    host 16Ψ/N
//   stage 3 + both offloaded        device 0       host 18Ψ/N
// With optimizer_nvme the optimizer's part (K + 4 bytes per owned
// parameter, as above) is on NVMe instead of the host: the device figure
// stays, the host figure loses it.
struct PaperBytes {
  double device = 0.0;
  double host = 0.0;
  double nvme = 0.0;
};
PaperBytes paper_offload_bytes(double psi, int world, int stage, bool optimizer_offload, bool param_offload,
                               double k = 12.0, double compute_bytes = 2.0, bool optimizer_nvme = false);
// ZeRO-Infinity's accounting (Rajbhandari et al. 2021, arXiv 2104.07857,
// its memory requirements: 240 x layers x hidden^2 bytes of model states
// for 12 hidden^2 parameters a layer), 2b + K + 4 bytes a parameter: 20 at
// b = 2, K = 12 (fp16 parameters and gradients, fp32 master, momentum,
// variance and the host update's fp32 gradients). With offload_optimizer
// and offload_param nvme at stage 3 all of it is on NVMe, divided over the
// N ranks: (2b + K + 4)Ψ/N per rank. ZEST keeps the gradients on the
// device and, with offload_param nvme, the shards within max_in_cpu in host
// memory; zest-estimate prints this beside its own count.
double paper_infinity_nvme_bytes(double psi, int world, double k = 12.0, double compute_bytes = 2.0);
// K for a run in `compute_dtype`: the master copy (none in fp32, where the
// parameters are the master) plus the optimizer's state buffers, each of its
// dtype, as DeepSpeed counts them: 12 for the paper's mixed-precision Adam,
// 6 with bf16 master weights and state (a bf16 master partition of its own
// there, where ZEST's is the parameters).
double paper_k(DType compute_dtype, const OptimizerConfig& optimizer, DType master_dtype = DType::kFloat32,
               DType state_dtype = DType::kFloat32);

enum class FitCriterion : uint8_t {
  kModelStates,  // persistent model states only, as the paper counts
  kPeak,         // peak_bytes: model states and the transients
};

struct FitOptions {
  FitCriterion criterion = FitCriterion::kPeak;
  // Models are from_total(Ψ, unit_numel): units of this many parameters, or
  // one unit when 0 (then stages 2-3 gather or stage the whole model).
  size_t unit_numel = 0;
  // When set, the host bytes one rank may use (host memory / ranks per
  // host): the model must fit both (host_peak_bytes, or with kModelStates
  // host_model_state_bytes).
  std::optional<int64_t> host_bytes;
  // When set, the NVMe bytes one rank may use (a drive's capacity / the
  // ranks sharing it): with offload_optimizer nvme, nvme_bytes must fit.
  std::optional<int64_t> nvme_bytes;
};

// The largest Ψ whose estimate under `options` (its stage included) fits in
// `device_bytes`: fits(Ψ) and not fits(Ψ + 1). The peak criterion counts
// peak_bytes plus the runtime reserve; the model-states one (the paper's
// count) the model states alone. 0 when a single parameter
// does not fit. By bisection, so a model's bytes need not be monotone in Ψ
// (the persistence threshold makes them not).
size_t largest_fitting_model(int64_t device_bytes, const EstimateOptions& options,
                             const FitOptions& fit = {});

// "The largest model that fits N devices of device_bytes with host_bytes of
// host memory per rank": a row per offload choice (none; optimizer; at stage
// 3 optimizer and parameters; with nvme_bytes, the NVMe bytes of a rank,
// the optimizer on NVMe, and at stage 3 with the parameters on the host), a
// column per stage of `stages`, each cell the largest Ψ by the peak
// criterion, marked with the memory that bounds it.
std::string format_fit_table(const EstimateOptions& options, int64_t device_bytes, int64_t host_bytes,
                             size_t unit_numel, const std::vector<int>& stages = {0, 1, 2, 3},
                             std::optional<int64_t> nvme_bytes = std::nullopt);

// Whether options.zero.stage allows the offload and precision choices of
// `options`: offload_optimizer and bf16 master weights at stages 1-3,
// offload_param at 3 (with the optimizer offloaded whole). The tables skip
// the stages that do not.
bool offload_allowed(const EstimateOptions& options);

struct TableOptions {
  std::vector<int> stages = {0, 1, 2, 3};
  // When set, rows for the largest models that fit this many bytes (both
  // criteria), scaled from the model's largest unit.
  std::optional<int64_t> device_bytes;
};

// Every stage of `stages` side by side (options.zero.stage is ignored), a
// row per category, the totals, the paper's figure and the padding, each
// row with the formula it follows. Bytes in GB (1e9), as the paper gives
// them, with the totals in GiB as well.
std::string format_estimate_table(const ModelDescription& model, const EstimateOptions& options,
                                  const TableOptions& table = {});

}  // namespace zest
