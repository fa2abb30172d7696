// Loading a Hugging Face checkpoint directory (hf_checkpoint.h) into a
// finalized engine: a fine-tuning run's starting point.
//
//   // zest-example: prelude=engine
//   #include <zest/hf/hf_import.h>
//   zest::HfImportOptions options;
//   options.allow_missing = [](const std::string& name) { return name.find(".lora_") != std::string::npos; };
//   zest::HfImportReport r = zest::import_hf(engine, "Llama-3.2-1B", options);  // after finalize()
//
// Collective. Every rank opens the directory (headers only), maps the
// checkpoint's names to the engine's (options.names; Llama's names map to
// themselves) and checks the match: every registered parameter present
// (unless allow_missing says it may keep its values: LoRA adapters), no
// tensor the model does not register (unless ignore_extra), every shape the
// registered one, every dtype F32, F16, BF16 or F64. Then each rank reads
// only the byte ranges of the elements of the shard it owns (stages 1-3: the
// ranks together read the checkpoint about once; stage 0: every rank owns
// and reads everything), as stored, with positioned reads (or mapped:
// map_files), checking each range for NaN/Inf, and
// converts a clean unit straight into the master shard and the parameters
// (exact from bf16, fp16 and fp32) while the next unit is read
// (load_owned_weights), so the memory an import adds is two units' shards as
// stored, whatever the model's size. A checkpoint in the compute dtype (bf16
// into a bf16 engine) is read straight into the parameters, and the fp32
// master weights are widened from them when first read (Note [a master
// widened when first read] in engine/engine_load.cpp: the first step pays
// that pass, the import does not).
// On a device mesh (Engine::model_parallel(): tp x pp above 1) each rank
// reads its own stage's tensors, and of a tensor-parallel parameter
// (ParamSpec::tp_split) its tp slice of the whole tensor, run by run
// (checkpoint/detail/owned_pieces.h's SourceMap): the tensor's shape is checked
// against the whole parameter's, and a tensor is extra only when no rank of
// the model-parallel group registers it (counted over that group once the
// match has been agreed over the whole mesh).
// Note [adapters beside the checkpoint]: where the directory also holds
// adapter_model.safetensors, its tensors, named as PEFT names them
// (base_model.model. + the model's name, through options.names), are read
// into the registered parameters of those names (LoRA adapters) in the same
// pass as the shards: a LoRA run exported with its adapters apart continues
// from them. A tensor of the file that no parameter takes, or of another
// shape, is a problem like any other (a model without adapters cannot
// silently drop them: enable LoRA as adapter_config.json describes it, or
// set ignore_adapters); not yet on a device mesh, where it is refused.
// The optimizer state is zeroed and the step count restarts. Every problem is reported
// together in ONE zest::Error, identical on every rank, each line naming the
// tensor: those of the match before anything is read (the engine is then
// unchanged), the non-finite values found on any rank after the reads (the
// shards of units holding one keep their previous weights, except a frozen
// unit read in place, which has no other copy of them: it is zeroed).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "zest/checkpoint/weights_io.h"
#include "zest/engine/engine.h"
#include "zest/hf/hf_name_map.h"

namespace zest {

struct HfImportOptions {
  HfNameMap names{};
  // Registered parameters (by the engine's name) that may be absent from
  // the checkpoint: they keep the values they have.
  std::function<bool(const std::string& engine_name)> allow_missing{};
  // Tensors of the checkpoint that the model does not register are skipped
  // instead of being an error.
  bool ignore_extra = false;
  // Note [adapters beside the checkpoint]: an adapter_model.safetensors in
  // the directory (PEFT's save_pretrained, export_hf with adapters apart)
  // is read too, unless this is set.
  bool ignore_adapters = false;
  // Threads per rank that read and convert (positioned reads of a unit's
  // pieces at once: what a fast disk or the page cache needs to be kept
  // busy). With many ranks on one host, fewer.
  int read_threads = kDefaultReadThreads;
  // The checkpoint's bytes read with pread into two reused buffers (the
  // default), or, true, looked at in place in the page cache (mapped: no
  // copy). Measured on an x86 VM, mapping was the slower by 20-40% cold and
  // warm (bench/hf_load_bench --read both): reading a mapping walks 4 KiB
  // pages, where the kernel's copy reads through its own huge mappings.
  bool map_files = false;
  // Called on every rank after each piece read, with this rank's tensor
  // bytes read and the total it reads. Unset: rank 0 logs the progress
  // every few seconds of a long load.
  std::function<void(uint64_t done, uint64_t total)> progress{};
};

struct HfImportReport {
  uint64_t bytes_read = 0;    // by this rank, headers included
  uint64_t tensor_bytes = 0;  // of the whole checkpoint
  int tensors_loaded = 0;     // registered parameters set from the checkpoint
  int adapters_loaded = 0;    // of them, from adapter_model.safetensors
  double read_seconds = 0;    // this rank's open, checks, reads and the shards' stores
  double seconds = 0;         // all of it, the engine taking the values included
};

HfImportReport import_hf(Engine& engine, const std::string& dir, const HfImportOptions& options = {});

}  // namespace zest
