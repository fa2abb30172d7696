// DeepSpeed's tensor_parallel and pipeline sections: the sizes of the model's
// split, kept in EngineConfig::tensor_parallel_size and pipeline_stages for
// the memory estimator (zest-estimate). The engine splits nothing from a
// file: a program builds its DeviceMesh, its tensor-parallel layers and its
// pipeline stages, and gives the engine mesh.engine_model_parallel(); so
// the keys are noted as not acted on, with what to do instead.
#include <fmt/format.h>

#include <algorithm>

#include "zest/config/detail/config_sections.h"

namespace zest::config_detail {
namespace {

constexpr int kMaxRanks = 1 << 20;

const char* const kBuildTheMesh =
    "ZEST splits no model from a file: build a DeviceMesh of this size with the layers of "
    "torch/tensor_parallel.h (or torch/pipeline_stage.h) and pass mesh.engine_model_parallel() to "
    "Engine::set_model_parallel; zest-estimate reads it as --tp (--pp)";

// TPTrainingConfig (deepspeed/runtime/tensor_parallel/config.py), a pydantic
// model: unknown keys refused. autotp_size > 1 turns AutoTP on; its nested
// tp (alias of tensor_parallel) holds tp_size, which DeepSpeed's
// _apply_autotp_partitioning requires to be 1 or autotp_size.
void read_tensor_parallel(Section& top, FileState& file) {
  std::optional<Section> s = top.sub("tensor_parallel", Unknown::kRefuse);
  if (!s) return;
  s->coerce_like_pydantic();
  int autotp = 0;  // DeepSpeed's default: off
  if (s->read_int("autotp_size", autotp, 0, kMaxRanks)) {
    file.ignored(s->where("autotp_size"), kBuildTheMesh);
    file.out.tensor_parallel_size = std::max(autotp, 1);
  }
  if (const char* key = s->either("tp", "tensor_parallel")) {
    if (std::optional<Section> t = s->sub(key, Unknown::kRefuse)) {
      t->coerce_like_pydantic();
      int tp_size = 1;
      if (t->read_int("tp_size", tp_size, 1, kMaxRanks) && tp_size != 1 && tp_size != file.out.tensor_parallel_size) {
        t->problem("tp_size", fmt::format("is {} and tensor_parallel.autotp_size {}: DeepSpeed requires tp_size to be "
                                          "1 or autotp_size; write the size once, as autotp_size",
                                          tp_size, file.out.tensor_parallel_size));
      }
      t->ignore("tp_grain_size", "the granularity of AutoTP's uneven splits, which DeepSpeed's training ignores");
      t->ignore("mpu", "a Python object for DeepSpeed's groups; ZEST's are the DeviceMesh's");
      t->ignore("tp_group", "a Python process group; ZEST's is mesh.tp()");
      t->finish();
    }
  }
  const std::string autotp_only = "how DeepSpeed's AutoTP splits or loads a Hugging Face model; ZEST's program "
                                  "splits its own layers (torch/tensor_parallel.h)";
  for (const char* k : {"dtype", "tp_overlap_comm", "injection_policy_tuple", "partition_config", "preset_model",
                        "keep_module_on_host"}) {
    s->ignore(k, autotp_only);
  }
  if (const char* k = s->either("replace_with_kernel_inject", "kernel_inject")) s->ignore(k, autotp_only);
  s->finish();
}

// get_pipeline_config (deepspeed/runtime/config.py) merges the section into
// its defaults with dict lookups, so other keys are not refused. Its
// "stages" ("auto" by default) is not read by DeepSpeed, whose
// PipelineModule takes num_stages from the program; it is where a file
// says the pipeline's depth, so it is kept.
void read_pipeline(Section& top, FileState& file) {
  std::optional<Section> s = top.sub("pipeline", Unknown::kIgnoreUnlessTypo);
  if (!s) return;
  if (s->read_int("stages", file.out.pipeline_stages, 1, kMaxRanks)) {
    file.ignored(s->where("stages"), std::string(kBuildTheMesh) +
                                         "; DeepSpeed itself takes the stages from PipelineModule(num_stages)");
  }
  for (const char* k : {"partition", "seed_layers", "activation_checkpoint_interval", "pipe_partitioned",
                        "grad_partitioned", "use_reentrant"}) {
    s->ignore(k, "how DeepSpeed's PipelineModule places and recomputes layers; ZEST's program builds its stages "
                 "(torch/pipeline_stage.h)");
  }
  s->finish();
}

}  // namespace

void read_model_parallel(Section& top, FileState& file) {
  read_tensor_parallel(top, file);
  read_pipeline(top, file);
}

}  // namespace zest::config_detail
