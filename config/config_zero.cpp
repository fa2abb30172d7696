// zero_optimization, as DeepSpeed's DeepSpeedZeroConfig and its offload
// models define it (deepspeed/runtime/zero/config.py, offload_config.py):
// every field under its name and its alias ("stage3_prefetch_bucket_size"
// or "prefetch_bucket_size"), the deprecated names, and an unknown key
// refused (the models forbid extra keys).
#include <limits>

#include <fmt/format.h>

#include "zest/config/detail/config_sections.h"
#include "zest/config/detail/json_parse.h"

namespace zest::config_detail {
namespace {

const char* const kSameValues = "an implementation choice of DeepSpeed's; ZEST computes the same values its own way";

// offload_optimizer / offload_param (DeepSpeedZeroOffloadOptimizerConfig /
// ...ParamConfig): device "none", "cpu" (ZeRO-Offload) or "nvme"
// (ZeRO-Infinity, which needs nvme_path). The keys that tune only
// DeepSpeed's NVMe swapping are read with any device (so a bad value is an
// error either way) and noted as ignored unless the device is "nvme", as
// DeepSpeed reads them only for "nvme".
struct OffloadSection {
  bool present = false;
  bool cpu = false;
  bool nvme = false;
};

// Reads `device`; "auto" is the default ("none"), as DeepSpeed's models drop
// an unfilled "auto".
void read_device(Section& o, FileState& file, OffloadSection& s) {
  const json* d = o.get("device");
  if (!d) return;
  if (d->is_string() && d->get<std::string>() == "auto") {
    file.filled(o.where("device"), "none (the default)");
    return;
  }
  const int i = o.read_choice("device", {"none", "cpu", "nvme"});
  s.cpu = i == 1;
  s.nvme = i == 2;
}

// nvme_path: DeepSpeed's Path, a non-empty string here.
void read_nvme_path(Section& o, std::string& out) {
  const json* v = o.get("nvme_path");
  if (!v) return;
  if (!v->is_string() || v->get<std::string>().empty()) {
    o.problem("nvme_path", fmt::format("must be the path of a directory on the NVMe drive, got {}", v->dump()));
    return;
  }
  out = v->get<std::string>();
}

// Notes each of the NVMe-only keys present in `o` as ignored unless the
// device is nvme.
void note_nvme_keys(Section& o, FileState& file, const std::vector<const char*>& keys, bool nvme) {
  if (nvme) return;
  for (const char* k : keys) {
    if (o.value().contains(k) && !o.value().at(k).is_null()) {
      file.ignored(o.where(k), "an NVMe offload setting: DeepSpeed reads it only with device \"nvme\"");
    }
  }
}

// Opens `key`'s section and reads what both kinds have: device, pin_memory.
std::optional<Section> open_offload(Section& z, FileState& file, const char* key, OffloadSection& s,
                                    bool& pin_memory) {
  std::optional<Section> o = z.sub(key, Unknown::kRefuse);
  if (!o) return o;
  s.present = true;
  read_device(*o, file, s);
  o->read_bool("pin_memory", pin_memory);
  return o;
}

// After the section's keys: "nvme" without nvme_path refused; "cpu" or
// "nvme" where DeepSpeed does not act on it (`inert` says why, empty where
// it acts) noted and dropped; "none" noted.
void settle_offload(Section& z, FileState& file, const Section& o, const char* key, const std::string& path,
                    const std::string& inert, OffloadSection& s) {
  if (s.nvme && path.empty() && inert.empty()) {
    file.problem(fmt::format("{} is \"nvme\" without {}: name the directory on the NVMe drive where the swap "
                             "files go",
                             o.where("device"), o.where("nvme_path")));
  } else if (!s.cpu && !s.nvme) {
    file.ignored(z.where(key), "device \"none\": nothing is offloaded");
  } else if (!inert.empty()) {
    file.ignored(z.where(key), inert);
    s.cpu = s.nvme = false;
  }
}

OffloadSection read_offload_optimizer(Section& z, FileState& file, int stage) {
  OffloadSection s;
  OffloadOptimizerConfig& c = file.out.offload_optimizer;
  std::optional<Section> o = open_offload(z, file, "offload_optimizer", s, c.pin_memory);
  if (!o) return s;
  o->read_double("ratio", c.ratio, 0.0, 1.0);
  read_nvme_path(*o, c.nvme_path);
  o->read_int("buffer_count", c.buffer_count, 0, kMaxCount);
  o->read_bool("pipeline_read", c.pipeline_read);
  o->read_bool("pipeline_write", c.pipeline_write);
  o->read_bool("fast_init", c.fast_init);
  note_nvme_keys(*o, file, {"nvme_path", "buffer_count", "pipeline_read", "pipeline_write", "fast_init"}, s.nvme);
  // Newer DeepSpeed's keys for Superchips (Grace Hopper) and CPU Adam.
  o->refuse_if("super_offload", is_on, "DeepSpeed's SuperOffload for Superchips", "false, as in ZEST");
  o->ignore("convert_grad_on_cpu", "where DeepSpeed converts offloaded gradients to fp32; ZEST's host update reads "
                                   "the compute dtype and computes the same values");
  o->ignore("cpuadam_cores_perc", "the share of cores DeepSpeed's SuperOffload CPU Adam uses");
  o->finish();
  // DeepSpeedZeroConfig.offload_ratio_check: the section with a ratio < 1 is
  // an error at stages 0-2, whatever its device.
  if (c.ratio < 1.0 && stage != 3) {
    file.problem(fmt::format("{} is {} at stage {}: DeepSpeed allows partial offload only at stage 3 and refuses "
                             "this file; set stage 3, or ratio 1 (in code, EngineConfig::offload_optimizer.ratio "
                             "below 1 works at stages 1-3)",
                             o->where("ratio"), c.ratio, stage));
  }
  // ZeRO off: DeepSpeed's fp16/bf16 optimizers never offload.
  settle_offload(z, file, *o, "offload_optimizer", c.nvme_path,
                 stage == 0 ? fmt::format("device \"{}\" at stage 0: DeepSpeed offloads the optimizer only under ZeRO "
                                          "(stages 1-3), and so does ZEST; nothing is offloaded",
                                          s.nvme ? "nvme" : "cpu")
                            : "",
                 s);
  if (s.cpu) c.device = OffloadDevice::kCpu;
  if (s.nvme) c.device = OffloadDevice::kNvme;
  return s;
}

OffloadSection read_offload_param(Section& z, FileState& file, int stage) {
  OffloadSection s;
  OffloadParamConfig& c = file.out.offload_param;
  std::optional<Section> o = open_offload(z, file, "offload_param", s, c.pin_memory);
  if (!o) return s;
  o->read_int("buffer_count", c.buffer_count, 0, kMaxCount);
  o->read_int("buffer_size", c.buffer_size, 0, kMaxCount);
  o->read_int("max_in_cpu", c.max_in_cpu, 0, kMaxCount);
  read_nvme_path(*o, c.nvme_path);
  // DeepSpeed reads all four only for "nvme" (its parameter swapper's pool
  // and how much of the model stays in CPU memory beside NVMe).
  note_nvme_keys(*o, file, {"nvme_path", "buffer_count", "buffer_size", "max_in_cpu"}, s.nvme);
  o->finish();
  settle_offload(z, file, *o, "offload_param", c.nvme_path,
                 stage < 3 ? fmt::format("DeepSpeed offloads parameters only at stage 3; this is stage {}, so nothing "
                                         "is offloaded",
                                         stage)
                           : "",
                 s);
  if (s.cpu) c.device = OffloadDevice::kCpu;
  if (s.nvme) c.device = OffloadDevice::kNvme;
  return s;
}

// DeepSpeed's deprecated booleans (DeepSpeedZeroConfig's deprecated fields):
// cpu_offload true is offload_optimizer {"device": "cpu"} and
// cpu_offload_param true is offload_param {"device": "cpu"}, each with the
// section's defaults (pin_memory false); false is no section. Written
// together with the section they stand for, DeepSpeed refuses the file.
// cpu_offload_use_pin_memory is deprecated without a replacement that it
// sets: DeepSpeed warns and pins nothing.
void read_deprecated_offload(Section& z, FileState& file, int stage, const OffloadSection& opt,
                             const OffloadSection& param) {
  struct Old {
    const char* key;
    const char* section;
    bool written;
  };
  for (const Old& old : {Old{"cpu_offload", "offload_optimizer", opt.present},
                         Old{"cpu_offload_param", "offload_param", param.present}}) {
    bool on = false;
    if (!z.read_bool(old.key, on)) continue;
    if (old.written) {
      z.problem(old.key, fmt::format("is the deprecated form of {}, and the file writes both: DeepSpeed refuses "
                                     "that; keep only {}",
                                     z.where(old.section), z.where(old.section)));
      continue;
    }
    const bool params = std::string_view(old.section) == "offload_param";
    if (!on) {
      file.ignored(z.where(old.key), "false: nothing is offloaded");
    } else if (params && stage < 3) {
      file.ignored(z.where(old.key), fmt::format("DeepSpeed offloads parameters only at stage 3; this is stage {}, "
                                                 "so nothing is offloaded",
                                                 stage));
    } else if (!params && stage == 0) {
      file.ignored(z.where(old.key), "true at stage 0: DeepSpeed offloads the optimizer only under ZeRO (stages "
                                     "1-3), and so does ZEST; nothing is offloaded");
    } else {
      // Honoured, so not "ignored": DeepSpeed warns that it is deprecated.
      file.warn(z.where(old.key), fmt::format("deprecated: read as {} {{\"device\": \"cpu\"}} (write that "
                                              "instead)",
                                              old.section));
      if (params) file.out.offload_param.device = OffloadDevice::kCpu;
      else file.out.offload_optimizer.device = OffloadDevice::kCpu;
    }
  }
  bool pin = false;
  if (z.read_bool("cpu_offload_use_pin_memory", pin)) {
    file.ignored(z.where("cpu_offload_use_pin_memory"),
                 "deprecated, and DeepSpeed no longer applies it (it warns and pins nothing): write pin_memory in "
                 "offload_optimizer or offload_param");
  }
}

// ZeRO++ and MiCS: other partitionings and quantized communication.
void read_zero_variants(Section& z) {
  z.refuse_if("zero_quantized_weights", is_on, "ZeRO++ quantized weight gathers (qwZ)", "off, as in ZEST");
  z.refuse_if("zero_quantized_nontrainable_weights", is_on, "quantized storage of frozen weights",
              "off, as in ZEST");
  z.refuse_if("zero_quantized_gradients", is_on, "ZeRO++ quantized gradient reduction (qgZ)", "off, as in ZEST");
  z.refuse_if("zeropp_loco_param", is_on, "LoCo-ZeRO++ error feedback", "empty: LoCo is off");
}

// MiCS and hpZ (Notes [MiCS] and [hpZ] in config.h): honoured at stage 3,
// where DeepSpeed builds them; at stages 0-2 DeepSpeed never reads the keys,
// and a file setting them there is noted as ignored.
void read_hierarchical(Section& z, FileState& file) {
  ZeroConfig& c = file.out.zero;
  // "auto": the ranks of one host. A number in the file is used as it is,
  // whatever the host's size.
  std::optional<int64_t> local;
  if (file.program.local_world_size) local = *file.program.local_world_size;
  const AutoRule<int64_t> per_host{local, "local_world_size", "the ranks of one host", /*must_match_program=*/false,
                                   /*has_a_default=*/false};
  int shard = -1;
  if (z.read_int("mics_shard_size", shard, std::numeric_limits<int>::min(), std::numeric_limits<int>::max(),
                 &per_host)) {
    if (shard <= 0) {
      file.ignored(z.where("mics_shard_size"), "MiCS is off (-1 or 0)");
    } else if (c.stage != 3) {
      file.ignored(z.where("mics_shard_size"),
                   fmt::format("DeepSpeed shards within MiCS groups only at stage 3 (its MiCS_Optimizer); this is "
                               "stage {}, so the model states are sharded over every rank",
                               c.stage));
    } else {
      c.mics_shard_size = shard;
    }
  }
  int hpz = 1;
  if (z.read_int("zero_hpz_partition_size", hpz, 0, std::numeric_limits<int>::max(), &per_host)) {
    if (hpz <= 1) {
      file.ignored(z.where("zero_hpz_partition_size"), "1 or 0: hpZ is off");
    } else if (c.stage != 3) {
      file.ignored(z.where("zero_hpz_partition_size"),
                   fmt::format("DeepSpeed keeps hpZ's secondary parameter copy only at stage 3; this is stage {}",
                               c.stage));
    } else {
      c.zero_hpz_partition_size = hpz;
    }
  }
  if (z.read_bool("mics_hierarchical_params_gather", c.mics_hierarchical_params_gather) &&
      c.mics_hierarchical_params_gather) {
    file.ignored(z.where("mics_hierarchical_params_gather"),
                 c.mics_shard_size > 0 ? "gathers across hosts, then within, in DeepSpeed, the same values; ZEST "
                                         "gathers within the MiCS group in one all-gather"
                                       : "applies to MiCS sharding (mics_shard_size at stage 3) only");
  }
}

void read_zero_object(Section& z, FileState& file) {
  ZeroConfig& c = file.out.zero;
  z.read_int("stage", c.stage, 0, 3);
  z.read_bool("contiguous_gradients", c.contiguous_gradients);
  z.read_bool("overlap_comm", c.overlap_comm);
  for (const char* always : {"reduce_scatter", "allgather_partitions"}) {
    bool on = true;
    if (z.read_bool(always, on) && !on) {
      file.ignored(z.where(always), fmt::format("false selects {} in DeepSpeed; ZEST always reduce-scatters "
                                                "and all-gathers at stages 1-3, which computes the same values",
                                                std::string_view(always) == "reduce_scatter" ? "an all-reduce"
                                                                                             : "broadcasts"));
    }
  }

  // Hugging Face's sizes for "auto": from the model's hidden size, the
  // stage-3 ones only at stage 3 (at other stages "auto" is the default).
  const std::optional<int64_t> h = file.program.hidden_size;
  const bool h_ok = h && *h >= 1 && *h < (int64_t{1} << 25);
  if (h && !h_ok) file.problem(fmt::format("AutoValues::hidden_size is {}; allowed: 1 to 2^25", *h));
  const bool z3 = c.stage == 3;
  AutoRule<int64_t> bucket{h_ok ? std::optional<int64_t>(*h * *h) : std::nullopt, "hidden_size", "hidden_size^2",
                           false};
  // int(0.9 * h * h) as Python evaluates it, left to right.
  AutoRule<int64_t> prefetch{h_ok && z3 ? std::optional<int64_t>(static_cast<int64_t>(0.9 * double(*h) * double(*h)))
                                        : std::nullopt,
                             "hidden_size", "int(0.9 x hidden_size^2)", false};
  AutoRule<int64_t> persist{h_ok && z3 ? std::optional<int64_t>(10 * *h) : std::nullopt, "hidden_size",
                            "10 x hidden_size", false};

  // DeepSpeed allows 0 for the bucket sizes: a bucket reduced as soon as
  // anything is in it, which ZEST spells 1 element.
  if (int64_t v = 0; z.read_int("reduce_bucket_size", v, 0, kMaxCount, &bucket)) c.reduce_bucket_size = std::max<int64_t>(v, 1);
  if (int64_t v = c.allgather_bucket_size; z.read_int("allgather_bucket_size", v, 0, kMaxCount))
    c.allgather_bucket_size = std::max<int64_t>(v, 1);
  if (const char* k = z.either("stage3_prefetch_bucket_size", "prefetch_bucket_size"))
    z.read_int(k, c.stage3_prefetch_bucket_size, 0, kMaxCount, &prefetch);
  if (const char* k = z.either("stage3_param_persistence_threshold", "param_persistence_threshold"))
    z.read_int(k, c.stage3_param_persistence_threshold, 0, kMaxCount, &persist);
  if (const char* k = z.either("stage3_max_live_parameters", "max_live_parameters"))
    z.read_int(k, c.stage3_max_live_parameters, 0, kMaxCount);

  if (const char* k = z.either("stage3_max_reuse_distance", "max_reuse_distance"))
    z.read_int(k, c.stage3_max_reuse_distance, 0, kMaxCount);
  if (const char* k = z.either("stage3_model_persistence_threshold", "model_persistence_threshold"))
    z.ignore(k, "a cap on stage-3 persistent elements; ZEST keeps a unit whole by "
                "stage3_param_persistence_threshold alone");
  if (const char* k = z.either("stage3_module_granularity_threshold", "module_granularity_threshold"))
    z.ignore(k, "groups small modules in DeepSpeed's stage-3 hooks; ZEST gathers the units you register");
  if (const char* k = z.either("stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params"))
    z.ignore(k, kSameValues);
  if (const char* k = z.either("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save"))
    z.ignore(k, "ZEST's checkpoints and zest-ckpt export always give the whole weights");
  z.ignore("stage3_gather_fp16_weights_on_model_save",
           "the old name of gather_16bit_weights_on_model_save: ZEST's checkpoints and zest-ckpt export always give "
           "the whole weights");
  z.ignore("sub_group_size", "the tile size of DeepSpeed's offloaded optimizer step; ZEST steps each shard whole");
  z.ignore("round_robin_gradients", "a schedule of DeepSpeed's stage 1-2 gradient copies to the host under CPU "
                                    "offload; ZEST copies each rank's owned shard in chunks");
  z.ignore("load_from_fp32_weights", "ZEST's checkpoints always restore the fp32 master weights");
  z.ignore("elastic_checkpoint", "no longer supported by DeepSpeed; zest-ckpt reshard changes a checkpoint's ranks");
  z.ignore("ignore_unused_parameters", "a check on DeepSpeed's gradient hooks; ZEST has none (done() per unit)");
  z.ignore("legacy_stage1", kSameValues);
  z.ignore("use_multi_rank_bucket_allreduce", kSameValues);
  z.ignore("memory_efficient_linear", "a stage-3 linear layer of DeepSpeed's; ZEST does not run the model");
  z.ignore("override_module_apply", "a stage-3 module hook of DeepSpeed's; ZEST does not run the model");
  z.ignore("pipeline_loading_checkpoint", "checkpoint loading for DeepSpeed's pipeline engine");
  z.ignore("log_trace_cache_warnings", "logging of DeepSpeed's stage-3 trace cache");
  if (const char* k = z.either("allgather_sequential", "stage3_allgather_sequential"))
    z.ignore(k, "gathers stage-3 parameters one by one in DeepSpeed, a matter of memory and speed; ZEST gathers "
                "each unit you register as one flat buffer");
  z.ignore("enable_sanity_checks", "debugging checks inside DeepSpeed's ZeRO code");
  z.ignore("save_muon_momentum_buffer_in_memory", "for the Muon optimizer with NVMe offload, neither of which ZEST "
                                                  "has");
  ignore_section(z, "leaf_module", {"classes", "name_suffixes", "names"},
                 "modules DeepSpeed's stage-3 hooks gather whole; ZEST gathers the units you register");
  z.refuse_if("zenflow", [](const json& v) { return !v.is_null(); }, "ZenFlow (stall-free offloaded optimizer "
              "updates)", "");
  const OffloadSection param = read_offload_param(z, file, c.stage);
  const OffloadSection opt = read_offload_optimizer(z, file, c.stage);
  read_deprecated_offload(z, file, c.stage, opt, param);
  read_zero_variants(z);
  read_hierarchical(z, file);
  z.finish();
}

}  // namespace

void read_zero(Section& top, FileState& file) {
  const json* v = top.get("zero_optimization");
  if (!v || !v->is_boolean()) {
    top.ignore("allgather_size", "read by DeepSpeed only with the deprecated \"zero_optimization\": true");
  }
  if (!v) return;
  if (v->is_boolean()) {
    // DeepSpeed's read_zero_config_deprecated: true is stage 1 with the
    // top-level allgather_size as its allgather bucket.
    file.out.zero.stage = v->get<bool>() ? 1 : 0;
    if (v->get<bool>()) top.read_int("allgather_size", file.out.zero.allgather_bucket_size, 1, kMaxCount);
    return;
  }
  if (!v->is_object()) {
    top.problem("zero_optimization", fmt::format("must be an object ({{...}}) or true/false, got {}",
                                                 detail::json_brief(*v)));
    return;
  }
  Section z(file, *v, "zero_optimization", Unknown::kRefuse);
  z.coerce_like_pydantic();  // DeepSpeedZeroConfig
  read_zero_object(z, file);
}

}  // namespace zest::config_detail
