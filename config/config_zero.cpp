// zero_optimization, as DeepSpeed's DeepSpeedZeroConfig and its offload
// models define it (deepspeed/runtime/zero/config.py, offload_config.py):
// every field under its name and its alias ("stage3_prefetch_bucket_size"
// or "prefetch_bucket_size"), the deprecated names, and an unknown key
// refused (the models forbid extra keys).
#include <fmt/format.h>

#include "zest/config/config_sections.h"
#include "zest/config/json_parse.h"

namespace zest::config_detail {
namespace {

const char* const kSameValues = "an implementation choice of DeepSpeed's; ZEST computes the same values its own way";

// offload_param / offload_optimizer: "none" is what ZEST does; "cpu" and
// "nvme" are ZeRO-Offload and ZeRO-Infinity, which it does not have.
void read_offload(Section& z, FileState& file, const char* key, int stage) {
  const bool params = std::string_view(key) == "offload_param";
  std::optional<Section> o = z.sub(key, Unknown::kRefuse);
  if (!o) return;
  std::string device = "none";
  if (const json* d = o->get("device")) {
    if (d->is_string() && d->get<std::string>() == "auto") {
      file.filled(o->where("device"), "none (the default)");
    } else {
      const int i = o->read_choice("device", {"none", "cpu", "nvme"});
      if (i > 0) device = i == 1 ? "cpu" : "nvme";
    }
  }
  // The other fields tune the transfers of an offload; they are checked by
  // name (DeepSpeed refuses others) and have nothing to tune when it is off.
  for (const char* k : {"nvme_path", "buffer_count", "pin_memory"}) o->get(k);
  if (params) {
    for (const char* k : {"buffer_size", "max_in_cpu"}) o->get(k);
  } else {
    for (const char* k : {"pipeline_read", "pipeline_write", "fast_init", "ratio"}) o->get(k);
  }
  o->finish();
  const std::string what = device == "cpu" ? "CPU memory (ZeRO-Offload)" : "NVMe (ZeRO-Infinity)";
  if (device == "none") {
    file.ignored(z.where(key), "device \"none\": nothing is offloaded, as in ZEST");
  } else if (params && stage < 3) {
    file.ignored(z.where(key), fmt::format("DeepSpeed offloads parameters only at stage 3; this is stage {}", stage));
  } else {
    file.problem(fmt::format("{}.device is \"{}\": that asks for offloading {} to {}, which ZEST does not have (it "
                             "keeps them in GPU memory, sharded by the stage); set the device to \"none\" or "
                             "remove {}",
                             z.where(key), device, params ? "parameters" : "optimizer state", what, key));
  }
}

// The deprecated booleans that stand for an offload section.
void read_deprecated_offload(Section& z, FileState& file, int stage) {
  if (const json* v = z.get("cpu_offload")) {
    if (is_on(*v)) {
      z.feature_problem("cpu_offload", *v, "optimizer-state offload to CPU memory (ZeRO-Offload; cpu_offload is the "
                                           "old name of offload_optimizer)");
    } else {
      file.ignored(z.where("cpu_offload"), "false: nothing is offloaded, as in ZEST");
    }
  }
  if (const json* v = z.get("cpu_offload_param")) {
    if (is_on(*v) && stage == 3) {
      z.feature_problem("cpu_offload_param", *v, "parameter offload to CPU memory (ZeRO-Offload)");
    } else {
      file.ignored(z.where("cpu_offload_param"), "parameters are offloaded only at stage 3, and only when true");
    }
  }
  z.ignore("cpu_offload_use_pin_memory", "pinning of offloaded memory; ZEST does not offload");
}

// ZeRO++ and MiCS: other partitionings and quantized communication.
void read_zero_variants(Section& z) {
  z.refuse_if("zero_hpz_partition_size", [](const json& v) { return v.is_number() && v.get<double>() > 1; },
              "ZeRO++ hierarchical partitioning (hpZ)", "1: one partition group, as in ZEST");
  z.refuse_if("zero_quantized_weights", is_on, "ZeRO++ quantized weight gathers (qwZ)", "off, as in ZEST");
  z.refuse_if("zero_quantized_nontrainable_weights", is_on, "quantized storage of frozen weights",
              "off, as in ZEST");
  z.refuse_if("zero_quantized_gradients", is_on, "ZeRO++ quantized gradient reduction (qgZ)", "off, as in ZEST");
  z.refuse_if("zeropp_loco_param", is_on, "LoCo-ZeRO++ error feedback", "empty: LoCo is off");
  z.refuse_if("mics_shard_size", [](const json& v) { return v.is_number() && v.get<double>() > 0; },
              "MiCS sharding (mics_shard_size)", "MiCS is off (-1 or 0)");
  z.ignore("mics_hierarchical_params_gather", "applies to MiCS sharding only");
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
    z.ignore(k, "a stage-3 release heuristic of DeepSpeed's hooks; ZEST frees a gathered unit when its handle ends");
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
  z.ignore("round_robin_gradients", "a copy schedule for CPU offload, which ZEST does not do");
  z.ignore("load_from_fp32_weights", "ZEST's checkpoints always restore the fp32 master weights");
  z.ignore("elastic_checkpoint", "no longer supported by DeepSpeed; zest-ckpt reshard changes a checkpoint's ranks");
  z.ignore("ignore_unused_parameters", "a check on DeepSpeed's gradient hooks; ZEST has none (done() per unit)");
  z.ignore("legacy_stage1", kSameValues);
  z.ignore("use_multi_rank_bucket_allreduce", kSameValues);
  z.ignore("memory_efficient_linear", "a stage-3 linear layer of DeepSpeed's; ZEST does not run the model");
  z.ignore("override_module_apply", "a stage-3 module hook of DeepSpeed's; ZEST does not run the model");
  z.ignore("pipeline_loading_checkpoint", "checkpoint loading for DeepSpeed's pipeline engine");
  z.ignore("log_trace_cache_warnings", "logging of DeepSpeed's stage-3 trace cache");
  read_offload(z, file, "offload_param", c.stage);
  read_offload(z, file, "offload_optimizer", c.stage);
  read_deprecated_offload(z, file, c.stage);
  read_zero_variants(z);
  z.finish();
}

}  // namespace

void read_zero(Section& top, FileState& file) {
  const json* v = top.get("zero_optimization");
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
  read_zero_object(z, file);
}

}  // namespace zest::config_detail
