// The rest of DeepSpeed's top level (runtime/config.py, _initialize_params):
// keys about what ZEST does not do, accepted and listed as ignored with the
// reason, and keys that ask for a feature ZEST lacks, refused by name. The
// sections DeepSpeed validates (its pydantic models) keep their key checks
// even when ignored, so a misspelt key inside one is still refused.
#include <limits>

#include <fmt/format.h>

#include "zest/config/detail/config_sections.h"

namespace zest::config_detail {

void ignore_section(Section& top, const char* key, std::initializer_list<const char*> keys, const std::string& reason) {
  std::optional<Section> s = top.sub(key, Unknown::kRefuse);
  if (!s) return;
  for (const char* k : keys) s->get(k);
  s->finish();
  top.ignore(key, reason);
}

namespace {

// Any "enabled": true inside `v` (compression_training nests its switches).
bool any_enabled(const json& v, int depth = 0) {
  if (depth > 16 || !(v.is_object() || v.is_array())) return false;
  if (v.is_object() && v.contains("enabled") && is_on(v.at("enabled"))) return true;
  for (const json& child : v) {
    if (any_enabled(child, depth + 1)) return true;
  }
  return false;
}

void read_ignored(Section& top) {
  top.ignore("memory_breakdown", "a memory printout: Engine::memory_report() gives it");
  top.ignore("dump_state", "prints DeepSpeed's state at start-up");
  top.ignore("flops_profiler", "DeepSpeed's FLOPs profiler of the model's forward, which ZEST does not run");
  top.ignore("autotuning", "DeepSpeed's autotuner, which its launcher runs before training");
  top.ignore("zero_allow_untested_optimizer", "lets DeepSpeed run a client optimizer under ZeRO; ZEST runs its own");
  top.ignore("zero_force_ds_cpu_optimizer", "chooses the optimizer for CPU offload, which ZEST does not do");
  top.ignore("checkpoint", "DeepSpeed's checkpoint tag and storage options; ZEST's checkpoints are its own "
                           "(checkpoint/checkpoint.h)");
  top.ignore("dataloader_drop_last", "for DeepSpeed's data loader; ZEST loads no data");
  top.ignore("graph_harvesting", "CUDA-graph capture of DeepSpeed's kernels, a matter of speed");
  top.ignore("disable_allgather", "read by DeepSpeed but no longer used");
  top.ignore("seq_parallel_communication_data_type", "for sequence parallelism, which ZEST does not do");
  top.ignore("datastates_ckpt", "DataStates' asynchronous checkpoint engine; ZEST's checkpoints are its own "
                                "(checkpoint/checkpoint.h)");
  top.ignore("log_level", "the level of DeepSpeed's logger; ZEST's own is ZEST_LOG_LEVEL");
  top.ignore("vocabulary_size", "read by DeepSpeed only for a warning about tensor-core alignment");
  top.ignore("use_data_before_expert_parallelism", "for expert (MoE) parallelism, which ZEST does not do");
  top.ignore("timers", "DeepSpeed's throughput timers");
  top.ignore("nebula", "DeepSpeed's Nebula checkpoint service");
  top.ignore("compile", "torch.compile settings; ZEST does not compile the model");
  const std::string monitor = "a training monitor's output; ZEST writes none (log StepResult yourself)";
  ignore_section(top, "tensorboard", {"enabled", "output_path", "job_name"}, monitor);
  ignore_section(top, "wandb", {"enabled", "group", "team", "project"}, monitor);
  ignore_section(top, "csv_monitor", {"enabled", "output_path", "job_name"}, monitor);
  ignore_section(top, "comet",
                 {"enabled", "samples_log_interval", "project", "workspace", "api_key", "experiment_name",
                  "experiment_key", "online", "mode"},
                 monitor);
  ignore_section(top, "comms_logger", {"enabled", "prof_all", "prof_ops", "verbose", "debug"},
                 "DeepSpeed's communication logger; CommCounters counts ZEST's collectives");
}

void read_refused(Section& top) {
  top.refuse_if("sparse_gradients", is_on, "sparse gradients (torch.sparse embedding gradients)", "false, as in ZEST");
  top.refuse_if("curriculum_learning", is_on, "curriculum learning", "curriculum learning is off");
  top.refuse_if("data_efficiency", is_on, "DeepSpeed's data efficiency library (curriculum learning, random-LTD)",
                "data efficiency is off");
  top.refuse_if("progressive_layer_drop", is_on, "progressive layer drop", "progressive layer drop is off");
  top.refuse_if("eigenvalue", is_on, "eigenvalue computation (for MoQ)", "eigenvalue computation is off");
  top.refuse_if("quantize_training", is_on, "quantization-aware training (MoQ)", "quantize_training is off");
  top.refuse_if("compression_training", [](const json& v) { return any_enabled(v); },
                "compression training (quantization, pruning, layer reduction)", "no compression is enabled");
  top.refuse_if("sparse_attention", [](const json& v) { return !v.is_null(); }, "DeepSpeed's sparse attention",
                "");
  top.refuse_if("elasticity", is_on, "elastic training (elasticity)", "elasticity is off");
  top.refuse_if("hybrid_engine", is_on, "the hybrid engine (RLHF generation)", "the hybrid engine is off");
  top.refuse_if("torch_autocast", is_on, "torch.autocast around the model's forward with fp32 parameters "
                "(torch_autocast); ZEST does not run the forward: set fp16 or bf16 instead",
                "torch_autocast is off");
  // parse_autoep_config: on only with "enabled" true (default false).
  top.refuse_if("expert_parallel",
                [](const json& v) {
                  return v.is_object() ? v.contains("enabled") && is_on(v.at("enabled")) : is_on(v);
                },
                "expert (MoE) parallelism (AutoEP)", "expert parallelism is off");
  // true, the default, is what ZEST does: micro-steps counted, one update per
  // accumulation boundary.
  top.refuse_if("managed_gradient_accumulation", [](const json& v) { return !(v.is_boolean() && v.get<bool>()); },
                "an optimizer update at every step() (managed_gradient_accumulation false); ZEST steps at the "
                "accumulation boundary", "true, as in ZEST");
  top.refuse_if("weight_quantization", [](const json& v) { return !v.is_null(); }, "weight quantization", "");
  // deepspeed/runtime/config.py's get_sequence_parallel_size (default 1),
  // the Ulysses group of ALST.
  top.refuse_if("sequence_parallel_size",
                [](const json& v) { return !v.is_null() && !(v.is_number_integer() && v.get<int64_t>() == 1); },
                "Ulysses sequence parallelism (sequence_parallel_size above 1); for long sequences ZEST computes "
                "attention, the MLP and the loss in tiles on each rank (docs/FINE_TUNING.md, Long sequences)",
                "1: no sequence parallelism, as in ZEST");
}

}  // namespace

// DeepSpeed's get_gradient_allreduce_op: "mean" (the default, and ZEST's
// averaging) or "sum", compared without case.
void read_allreduce_op(Section& top, FileState& file) {
  const int op = top.read_choice("gradient_allreduce_op", {"mean", "sum"});
  if (op == 1) {
    file.problem("gradient_allreduce_op is \"sum\": that asks for summed gradients across ranks, which ZEST does "
                 "not have (it averages them, DeepSpeed's \"mean\"); remove the key, or write \"mean\"");
  }
}

// DeepSpeed's activation_checkpointing section (deepspeed/runtime/
// activation_checkpointing/config.py) configures deepspeed.checkpointing,
// which the model calls; ZEST's is TorchModule::checkpoint.
void read_activation_checkpointing(Section& top, FileState& file) {
  std::optional<Section> a = top.sub("activation_checkpointing", Unknown::kRefuse);
  if (!a) return;
  a->read_bool("cpu_checkpointing", file.out.checkpoint_in_host_memory);
  a->ignore("partition_activations",
            "splits the kept inputs across the model-parallel group; ZEST has one model-parallel rank, where "
            "DeepSpeed keeps them whole too");
  a->ignore("contiguous_memory_optimization",
            "copies the kept inputs into one preallocated buffer; ZEST keeps the tensors themselves");
  a->ignore("number_checkpoints", "the size of contiguous_memory_optimization's buffer");
  a->ignore("synchronize_checkpoint_boundary", "a device synchronization at each checkpoint, for timing");
  a->ignore("profile", "DeepSpeed's timers of the checkpointed forward and backward");
  a->finish();
}

void read_other_features(Section& top, FileState& file) {
  read_activation_checkpointing(top, file);
  EngineConfig& c = file.out;
  top.read_bool("prescale_gradients", c.prescale_gradients);
  top.read_double("gradient_predivide_factor", c.gradient_predivide_factor, 1e-30, 1e30);
  // null: DeepSpeed's default, no lines. Any positive count, as DeepSpeed
  // takes it (2e16: in effect never).
  top.read_int("steps_per_print", c.steps_per_print, 1, std::numeric_limits<int64_t>::max());
  top.read_bool("wall_clock_breakdown", c.wall_clock_breakdown);
  read_ignored(top);
  read_refused(top);
  read_allreduce_op(top, file);
}

}  // namespace zest::config_detail
