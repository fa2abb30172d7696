// Pretrained checkpoints in the libtorch language-model examples (gpt,
// llama): the flags they share (--lora, --hf, --export-hf and the export's
// shard size, dtype and adapter files), loading a Hugging Face directory
// into the engine with the adapters it lacks left as initialized, and
// exporting one with the adapters merged into their weights (PEFT's
// merge_and_unload) or written apart (PEFT's adapter files).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "common/lm_options.h"
#include "common/rank_agreement.h"
#include "zest/core/dtype.h"
#include "zest/engine/engine.h"
#include "zest/hf/hf_import.h"
#include "zest/torch/lora.h"
#include "zest/torch/torch_module.h"

namespace examples {

struct PretrainedOptions {
  int64_t lora_r = 0;       // --lora R; 0: full fine-tuning
  double lora_alpha = 8.0;  // --lora-alpha, PEFT's default
  bool lora_alpha_given = false;
  std::string hf_dir;         // --hf: config.json and *.safetensors to start from
  std::string export_hf_dir;  // --export-hf: written after training
  int64_t max_shard_size = int64_t{5} * 1000 * 1000 * 1000;  // --max-shard-size, HF's "5GB"
  std::string export_dtype;  // --export-dtype fp32|bf16|fp16; empty: the checkpoint's, bf16 from scratch
  bool export_adapters = false;  // --export-adapters: PEFT's adapter files, not merged
  bool export_replace = false;   // --export-replace: HfExportOptions::replace

  zest::LoraOptions lora() const;
};

// Adds the flags above; `shard_size` receives --max-shard-size's text, for
// parse_byte_size once parsing is done. Returns the --hf option.
cli::Option* add_pretrained_flags(cli::App& app, PretrainedOptions& o, std::string& shard_size);
// After parsing: the shard size, and the combinations that cannot work.
// Throws cli::UsageError.
void finish_pretrained_flags(PretrainedOptions& o, const std::string& shard_size);

// The options of LmRunOptions, PretrainedOptions and MeshFlags that every
// rank must be started with alike (for check_ranks_agree): what is run, on
// what data, from and to which checkpoints, on which mesh. Not --ranks,
// --threads, --print-every or --timeout.
NamedOptions shared_run_options(const LmRunOptions& run, const PretrainedOptions& pretrained, const MeshFlags& mesh);

// "5GB", "500MB", "2GiB", "123456": bytes, as transformers' max_shard_size
// reads them (KB, MB, GB decimal; KiB, MiB, GiB binary). Throws UsageError.
int64_t parse_byte_size(const std::string& text);

// TorchModule::import_hf with the adapters allowed to be missing; prints
// what was read (rank 0). Collective.
zest::HfImportReport load_pretrained(zest::TorchModule& zt, const std::string& dir);

// export_hf of the engine's weights to o.export_hf_dir: config.json is
// `config_json` (its torch_dtype set to what is written), or the --hf
// directory's; the dtype --export-dtype's, else
// `checkpoint_dtype` (config.json's torch_dtype: a load and export without
// training gives the files back bit for bit), else bf16. With LoRA the
// adapters are merged into their weights, or with --export-adapters written
// apart as adapter_model.safetensors and adapter_config.json (targets:
// `lora_targets`). `run_inputs`: what else the run read or wrote (its
// checkpoint roots, data, config), which the export must not replace, as
// the --hf directory (HfExportOptions::inputs). Prints what was written
// (rank 0). Collective.
void export_pretrained(zest::Engine& engine, const PretrainedOptions& o, const std::string& config_json,
                       const std::string& checkpoint_dtype, const std::vector<std::string>& lora_targets,
                       const std::vector<std::string>& run_inputs);

}  // namespace examples
