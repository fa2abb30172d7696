// The memory estimate as text: every stage side by side, each row with the
// formula it follows, so a reader can check a number by hand.
#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "zest/core/check.h"
#include "zest/core/units.h"
#include "zest/engine/layout_constants.h"
#include "zest/optim/exact_sum.h"
#include "zest/estimate/count_text.h"
#include "zest/estimate/memory_estimate.h"

namespace zest {
namespace {

constexpr int kLabelWidth = 24;
constexpr int kCellWidth = 14;

class Table {
 public:
  Table(std::vector<MemoryEstimate> estimates, SiUnit unit)
      : e_(std::move(estimates)), unit_(unit) {}

  void header() {
    out_ += fmt::format("{:<{}}", "per rank", kLabelWidth);
    for (const MemoryEstimate& e : e_)
      out_ += fmt::format("{:>{}}", fmt::format("stage {}", e.options.zero.stage), kCellWidth);
    out_ += "   formula\n";
  }

  // A row of byte counts.
  void bytes(const std::string& label, const std::function<double(const MemoryEstimate&)>& value,
             const std::string& formula) {
    row(label, [&](const MemoryEstimate& e) {
      return fmt::format("{:.3f} {}", value(e) / unit_.scale, unit_.name);
    }, formula);
  }

  void gib(const std::string& label, const std::function<int64_t(const MemoryEstimate&)>& value) {
    row(label, [&](const MemoryEstimate& e) { return format_bytes(value(e)); }, "");
  }

  void row(const std::string& label, const std::function<std::string(const MemoryEstimate&)>& cell,
           const std::string& formula) {
    out_ += fmt::format("{:<{}}", label, kLabelWidth);
    for (const MemoryEstimate& e : e_) out_ += fmt::format("{:>{}}", cell(e), kCellWidth);
    out_ += formula.empty() ? "\n" : "   " + formula + "\n";
  }

  std::string& text() { return out_; }

 private:
  std::vector<MemoryEstimate> e_;
  SiUnit unit_;
  std::string out_;
};

double category(const MemoryEstimate& e, MemoryCategory c, bool peak) {
  return static_cast<double>(peak ? e[c].peak : e[c].persistent);
}

double transient(const MemoryEstimate& e, MemoryCategory c) {
  return static_cast<double>(e[c].peak - e[c].persistent);
}

}  // namespace

// The stages the offload and precision choices allow: offload_optimizer
// and bf16 master weights at stages 1-3; offload_param at 3.
bool offload_allowed(const EstimateOptions& o) {
  const bool bf16_master = o.master_dtype == DType::kBFloat16;
  return ((!o.offloads_optimizer() && !bf16_master) || o.zero.stage >= 1) &&
         (!o.offloads_params() || (o.zero.stage == 3 && carries_offloaded_params(o.offload_optimizer)));
}

std::string ModelDescription::summary() const {
  const size_t n = num_units();
  std::string s = fmt::format("{} parameters in {} unit{}", with_commas(numel()), with_commas(n),
                              n == 1 ? "" : "s");
  if (total_only && n == 1) return s + " (only a total was given: treated as one unit)";
  if (total_only) return s + fmt::format(" (a total split into units of {} parameters)",
                                         with_commas(units.front().numel()));
  return s;
}

std::string format_estimate_table(const ModelDescription& model, const EstimateOptions& options,
                                  const TableOptions& table) {
  std::vector<MemoryEstimate> est;
  double largest = 0;
  for (int stage : table.stages) {
    EstimateOptions o = options;
    o.zero.stage = stage;
    // The stages the offload choice allows (stages 1-3; parameters: 3), when
    // more than one was asked for.
    if (table.stages.size() > 1 && !offload_allowed(o)) continue;
    est.push_back(estimate_memory(model, o));
    largest = std::max(largest, static_cast<double>(est.back().peak_bytes));
  }
  ZEST_CHECK(!est.empty(), "no stage of those asked for allows this offload choice (optimizer and bf16 master "
                           "weights: stages 1-3; parameters: stage 3)");
  const EstimateOptions& o = est.front().options;
  const int b = static_cast<int>(elem_size(o.compute_dtype));
  const int states = o.optimizer.state_buffers();
  const bool offload = o.offloads_optimizer() || o.offloads_params();
  const int mb = static_cast<int>(elem_size(o.master_dtype));  // master weights' bytes an element
  const int sb = static_cast<int>(elem_size(o.state_dtype));   // a state buffer's
  const bool master_is_params = o.master_dtype == o.compute_dtype;

  std::string out = fmt::format("model: {}\n", model.summary());
  out += fmt::format(
      "ranks: N = {}; compute {} (b = {} bytes); {}, {} {} state buffer{}, {} master weights (K = {:g}); "
      "gradient accumulation {}\n",
      o.world_size, dtype_name(o.compute_dtype), b, optimizer_name(o.optimizer.kind), states,
      dtype_name(o.state_dtype), states == 1 ? "" : "s", dtype_name(o.master_dtype), est.front().paper_k,
      o.gradient_accumulation_steps);
  out += "Ψ = parameters; Ψ' = elements with alignment and shard padding; s = Ψ'/N owned per rank "
         "(N = 1 at stage 0)\n";
  if (o.tp_size * o.pp_size > 1) {
    out += fmt::format("mesh: dp {} x tp {} x pp {} = {} ranks; the model is one rank's share of a pipeline stage, "
                       "sharded by ZeRO over the N = {} data-parallel ranks\n",
                       o.world_size, o.tp_size, o.pp_size, o.mesh_size(), o.world_size);
  }
  if (const int s = o.zero.mics_shard_size; s > 0 && s < o.world_size) {
    out += fmt::format("MiCS: mics_shard_size {}: at stage 3 the model states are sharded over groups of {} ranks "
                       "(N = {} there) and replicated across the {} groups; stages 0-2 shard over all N ranks\n",
                       s, s, s, o.world_size / s);
  }
  if (const int h = o.zero.zero_hpz_partition_size; h > 1 && h < o.world_size) {
    out += fmt::format("hpZ: zero_hpz_partition_size {}: at stage 3 each gathered unit also keeps a copy sharded "
                       "over {} ranks (padded / {}) from its first gather until the step, in the peak\n",
                       h, h, h);
  }
  if (o.offloads_optimizer_to_nvme()) {
    out += fmt::format("offload_optimizer: nvme, ratio {:g}: that part of each rank's master weights and optimizer "
                       "state is in a swap file on NVMe (two copies, records of 4096-byte alignment), streamed "
                       "through {} host buffers, with the copies' staging in host memory\n",
                       o.offload_optimizer.ratio, o.offload_optimizer.buffer_count);
  } else if (o.offloads_optimizer()) {
    out += fmt::format("offload_optimizer: cpu, ratio {:g}{}: that part of each rank's master weights and optimizer "
                       "state is in host memory, with the copies' staging\n",
                       o.offload_optimizer.ratio, o.offload_optimizer.delayed_update ? ", delayed update" : "");
  }
  if (o.offloads_params()) {
    out += "offload_param: cpu: the parameter shards of the units gathered on demand are in host memory, and on "
           "the device only while gathered\n";
  }
  out += "\n";

  Table t(est, unit_for(largest));
  t.header();
  t.row("Ψ'", [](const MemoryEstimate& e) { return with_commas(e.padded_numel); },
        fmt::format("Ψ = {}", with_commas(est.front().numel)));
  using C = MemoryCategory;
  t.bytes("parameters", [](const MemoryEstimate& e) { return category(e, C::kParameters, false); },
          fmt::format("{}Ψ'; stage 3: {}s, units of <= {} parameters kept whole", b, b,
                      o.zero.stage3_param_persistence_threshold));
  t.bytes("gradients", [](const MemoryEstimate& e) { return category(e, C::kGradients, false); },
          fmt::format("{}Ψ' at stages 0-1, {}s at 2-3{}", b, b,
                      o.gradient_accumulation_steps <= 1 ? std::string()
                      : o.zero.reduce_at_accumulation_boundary
                          ? fmt::format("; + {}Ψ' accumulator at 0-1 (reduced at the boundary)", b)
                          : fmt::format("; + {}s accumulator at 0-1", b)));
  t.bytes("master_weights",
          [](const MemoryEstimate& e) { return category(e, C::kMasterWeights, false); },
          master_is_params ? fmt::format("none: the {} parameters are the master copy", dtype_name(o.compute_dtype))
          : o.offloads_optimizer() ? fmt::format("{}(s - h), h owned elements on the host", mb)
                                   : fmt::format("{}s", mb));
  t.bytes("optimizer_state",
          [](const MemoryEstimate& e) { return category(e, C::kOptimizerState, false); },
          o.offloads_optimizer() ? fmt::format("{}(s - h)", sb * states) : fmt::format("{}s", sb * states));
  t.bytes("model states", [](const MemoryEstimate& e) { return static_cast<double>(e.model_state_bytes); },
          "the sum of the four above");
  t.gib("  in binary units", [](const MemoryEstimate& e) { return e.model_state_bytes; });
  if (offload) {
    t.bytes("published (device)", [](const MemoryEstimate& e) { return e.paper_bytes; },
            fmt::format("paper_offload_bytes: bΨ at 1-2, bΨ/N at 3, 0 with parameters offloaded; b = {}", b));
  } else {
    t.bytes("ZeRO paper", [](const MemoryEstimate& e) { return e.paper_bytes; },
            fmt::format("(2b+K)Ψ | 2bΨ+KΨ/N | bΨ+(b+K)Ψ/N | (2b+K)Ψ/N for stages 0|1|2|3, "
                        "b = {}, K = {:g}",
                        b, est.front().paper_k));
  }
  t.bytes("padding", [](const MemoryEstimate& e) { return static_cast<double>(e.padding_bytes); },
          "model states minus the same with Ψ' = Ψ (no alignment or padding)");
  if (offload) {
    t.bytes("host: parameters", [](const MemoryEstimate& e) { return static_cast<double>(e.host(C::kParameters).persistent); },
            fmt::format("{}s of the sharded units (offload_param)", b));
    t.bytes("host: master+optim",
            [](const MemoryEstimate& e) {
              return static_cast<double>(e.host(C::kMasterWeights).persistent +
                                         e.host(C::kOptimizerState).persistent);
            },
            o.offloads_optimizer_to_nvme()
                ? std::string("0: on NVMe (below)")
                : fmt::format("{}h (a master copy even where the master is the parameters)", mb + sb * states));
    t.bytes("host: staging",
            [](const MemoryEstimate& e) {
              return static_cast<double>(e.host(C::kCommBuffers).peak - e.host_swap_buffer_bytes);
            },
            o.offload_optimizer.delayed_update ? fmt::format("{}h: the host part's gradients and parameters", 2 * b)
                                               : fmt::format("{} chunk slots of {} bytes per element",
                                                             master_is_params && !o.offloads_optimizer_to_nvme() ? 2 : 4,
                                                             b));
    if (o.offloads_optimizer_to_nvme()) {
      t.bytes("host: swap ring", [](const MemoryEstimate& e) { return static_cast<double>(e.host_swap_buffer_bytes); },
              fmt::format("{} records of a chunk's master and state, + 4096 to align them",
                          o.offload_optimizer.buffer_count));
    }
    t.bytes("host model states", [](const MemoryEstimate& e) { return static_cast<double>(e.host_model_state_bytes); },
            "host parameters + master + optimizer state");
    t.bytes("host peak", [](const MemoryEstimate& e) { return static_cast<double>(e.host_peak_bytes); },
            o.offloads_optimizer_to_nvme() ? "host model states + staging + swap ring" : "host model states + staging");
    t.bytes("published (host)", [](const MemoryEstimate& e) { return e.paper_host_bytes; },
            fmt::format("paper_offload_bytes: (K+4)Ψ/N (+ bΨ/N with parameters), K = {:g}", est.front().paper_k));
  }
  if (o.offloads_optimizer_to_nvme()) {
    t.bytes("nvme: master", [](const MemoryEstimate& e) { return static_cast<double>(e.nvme(C::kMasterWeights).persistent); },
            fmt::format("2 x {}h, chunks rounded up (two regions)", mb));
    t.bytes("nvme: optim+pad", [](const MemoryEstimate& e) { return static_cast<double>(e.nvme(C::kOptimizerState).persistent); },
            fmt::format("2 x {}h and the records' padding to 4096", sb * states));
    t.bytes("nvme (swap file)", [](const MemoryEstimate& e) { return static_cast<double>(e.nvme_bytes); },
            "the swap file per rank, as the engine creates it");
    t.bytes("published (nvme)", [](const MemoryEstimate& e) { return e.paper_nvme_bytes; },
            fmt::format("paper_offload_bytes: (K+4)Ψ/N on NVMe, K = {:g}", est.front().paper_k));
    t.bytes("ZeRO-Infinity", [&](const MemoryEstimate& e) {
              return paper_infinity_nvme_bytes(static_cast<double>(e.numel), o.zero.shard_group_size(o.world_size),
                                               e.paper_k, static_cast<double>(b));
            },
            "(2b+K+4)Ψ/N all on NVMe with offload_param nvme too (stage 3; ZEST runs the optimizer's part)");
  }
  t.row("live / grad units", [](const MemoryEstimate& e) {
    return fmt::format("{} / {}", e.live_units, e.grad_units_in_flight);
  }, "stage 3 gathered units; stages 2-3 full gradients awaiting reduce-scatter");
  t.bytes("+ live parameters", [](const MemoryEstimate& e) { return transient(e, C::kParameters); },
          fmt::format("{} x the live units' Ψ'", b));
  t.bytes("+ gradient staging", [](const MemoryEstimate& e) { return transient(e, C::kGradients); },
          fmt::format("{} x the grad units' Ψ'", b));
  t.bytes("+ comm_buffers", [](const MemoryEstimate& e) { return transient(e, C::kCommBuffers); },
          fmt::format("max(4 x min(largest unit's Ψ', {}) (finalize staging), 8(s/{} + {}) (norm chunk sums))",
                      kInitStagingNumel, kShardQuantum, kExactWords));
  t.bytes("peak (at most)", [](const MemoryEstimate& e) { return static_cast<double>(e.peak_bytes); },
          "model states + max(staging, live parameters + gradient staging, norm sums)");
  t.gib("  in binary units", [](const MemoryEstimate& e) { return e.peak_bytes; });

  if (table.device_bytes) {
    const int64_t device = *table.device_bytes;
    // Scaled from this model's largest unit: more units like it. A total
    // without unit sizes stays one unit.
    const size_t unit = model.total_only && model.num_units() == 1 ? 0 : model.largest_unit_numel();
    const auto fit = [&](FitCriterion c) {
      return [=](const MemoryEstimate& e) {
        return short_count(largest_fitting_model(device, e.options, {c, unit, std::nullopt, std::nullopt}));
      };
    };
    const std::string size = fmt::format("{:.3g} GB = {}", static_cast<double>(device) / 1e9,
                                         format_bytes(device));
    const std::string units = unit == 0 ? "one unit"
                                        : fmt::format("units of {} parameters", with_commas(unit));
    t.row("fits: this model", [=](const MemoryEstimate& e) {
      return e.peak_bytes <= device ? "yes" : "no";
    }, fmt::format("peak <= {}", size));
    t.row("largest Ψ, states", fit(FitCriterion::kModelStates),
          fmt::format("model states <= {} ({})", size, units));
    t.row("largest Ψ, peak", fit(FitCriterion::kPeak), fmt::format("peak <= {} ({})", size, units));
  }
  out += t.text();
  out += "\nRequested bytes by category, as the allocator counts them; activations and the "
         "allocator's rounding and caching are not included.\n";
  return out;
}

std::string format_fit_table(const EstimateOptions& options, int64_t device_bytes, int64_t host_bytes,
                             size_t unit_numel, const std::vector<int>& stages, std::optional<int64_t> nvme_bytes) {
  struct Choice {
    const char* name;
    OffloadDevice optimizer;
    bool params;
  };
  std::vector<Choice> choices = {{"no offload", OffloadDevice::kNone, false},
                                 {"offload_optimizer", OffloadDevice::kCpu, false},
                                 {"optimizer + param", OffloadDevice::kCpu, true}};
  if (nvme_bytes) {
    choices.push_back({"optimizer nvme", OffloadDevice::kNvme, false});
    choices.push_back({"nvme + param cpu", OffloadDevice::kNvme, true});
  }
  const int64_t reserve =
      options.runtime_reserve_bytes.value_or(default_runtime_reserve_bytes(options.mesh_size()));
  std::string out = fmt::format("largest Ψ that fits a device of {} and a host share of {}{} per rank, at the peak "
                                "with {} kept for the CUDA context{} (N = {}; units of {})\n",
                                format_bytes(device_bytes), format_bytes(host_bytes),
                                nvme_bytes ? " and an NVMe share of " + format_bytes(*nvme_bytes) : std::string(),
                                format_bytes(reserve), options.mesh_size() > 1 ? " and NCCL" : "", options.world_size,
                                unit_numel == 0 ? "one unit" : with_commas(unit_numel) + " parameters");
  out += fmt::format("{:<{}}", "", kLabelWidth);
  for (int stage : stages) out += fmt::format("{:>{}}", fmt::format("stage {}", stage), kCellWidth);
  out += "\n";
  for (const Choice& c : choices) {
    out += fmt::format("{:<{}}", c.name, kLabelWidth);
    for (int stage : stages) {
      EstimateOptions o = options;
      o.zero.stage = stage;
      o.offload_optimizer.device = c.optimizer;
      o.offload_param.device = c.params ? OffloadDevice::kCpu : OffloadDevice::kNone;
      if (c.optimizer == OffloadDevice::kNvme) o.offload_optimizer.delayed_update = false;
      if (!offload_allowed(o)) {
        out += fmt::format("{:>{}}", "-", kCellWidth);
        continue;
      }
      FitOptions fit{FitCriterion::kPeak, unit_numel, host_bytes, std::nullopt};
      if (c.optimizer == OffloadDevice::kNvme) fit.nvme_bytes = nvme_bytes;
      const size_t psi = largest_fitting_model(device_bytes, o, fit);
      // Which memory stops the next parameter: NVMe when its file would
      // not fit, else the host when the device alone would still take it.
      const MemoryEstimate next = estimate_memory(ModelDescription::from_total(psi + 1, unit_numel), o);
      const bool nvme_bound = fit.nvme_bytes && next.nvme_bytes > *fit.nvme_bytes;
      const bool host_bound = !nvme_bound && next.peak_bytes + next.runtime_reserve_bytes <= device_bytes;
      out += fmt::format("{:>{}}", short_count(psi) + (nvme_bound ? " (n)" : host_bound ? " (h)" : ""), kCellWidth);
    }
    out += "\n";
  }
  out += nvme_bytes ? "(n): NVMe is the limit; (h): host memory; otherwise the device.\n"
                    : "(h): host memory is the limit; otherwise the device.\n";
  return out;
}

}  // namespace zest
