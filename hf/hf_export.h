// Writing the engine's weights as a Hugging Face model directory, as
// transformers' save_pretrained does: config.json, the weights in shards of
// at most max_shard_size bytes of tensor data each
// (model-00001-of-00003.safetensors, ...) with model.safetensors.index.json
// ({"metadata": {"total_size": N}, "weight_map": {...}}), or one
// model.safetensors when everything fits in one shard.
//
//   // zest-example: prelude=engine
//   #include <zest/hf/hf_export.h>
//   zest::HfExportOptions options;
//   options.config_from = "Llama-3.2-1B";          // copy its config.json
//   options.max_shard_size = uint64_t{2} << 30;    // 2 GiB shards
//   zest::export_hf(engine, "Llama-3.2-1B-tuned", options);
//
// Collective. The fp32 master weights go out in options.dtype (bf16 by
// default; fp16 or fp32), under the engine's names mapped back through
// options.names. Memory stays bounded: one unit is gathered at a time
// (every rank takes part; rank 0 writes) and converted in pieces. On a
// tensor x pipeline mesh the units are the whole model's, joined from the
// tp x pp ranks' parts (checkpoint/whole_model.h; transform and unit_order
// see the whole model's unit indices): the directory one rank holding the
// whole model writes. Shards
// follow Hugging Face's rule: tensors in order fill a shard until the next
// would pass the limit; a tensor larger than the limit gets a shard of its
// own. The directory is published atomically, as checkpoints are
// (checkpoint_publish.h): written under a temporary name next to it, every
// file fsynced, then renamed into place (an existing directory of that name
// is replaced whole, never half-overwritten); a failure leaves it as it
// was. Its parent keeps the publisher's lock file, .zest-lock.
//
// transform, on rank 0, sees each unit's tensors (the engine's names and
// registered shapes) and may modify, rename, add or drop them before they
// are written, so a LoRA model exports with its adapters merged
// (W += scale * B A, lora_A and lora_B dropped). It is called twice per
// unit: first in the plan pass, before anything is gathered, with empty
// values (lay out the same names and shapes from them alone: the shards'
// headers are written first), then in the write pass with the fp32 values;
// both must give the same names and shapes. A transform that needs another
// unit's tensors keeps them itself: with unit_order, a LoRA merge visits
// each adapter unit (trainable, so a unit apart from the frozen weights it
// adapts) before the unit of those weights, keeps A and B (small) and
// merges them when the weights come. Tensors for which `adapter` is
// true go to a PEFT-style adapter_model.safetensors with
// adapter_config.json instead of the model's shards.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zest/core/dtype.h"
#include "zest/engine/engine.h"
#include "zest/hf/hf_name_map.h"

namespace zest {

struct HfTensor {
  std::string name;  // the engine's name (mapped through HfNameMap when written)
  std::vector<int64_t> shape;
  std::vector<float> values;  // empty in the plan pass
};

enum class HfExportPass { kPlan, kWrite };

struct HfExportOptions {
  // config.json: this text (a JSON object), or else the config.json of
  // the directory config_from (the checkpoint the run started from).
  std::string config_json;
  std::string config_from;
  DType dtype = DType::kBFloat16;  // bf16, fp16 or fp32
  // Bytes of tensor data per shard; Hugging Face's default "5GB".
  uint64_t max_shard_size = 5'000'000'000;
  HfNameMap names{};
  std::function<void(int unit, std::vector<HfTensor>& tensors, HfExportPass pass)> transform{};
  // The order in which units are gathered, given to transform and written:
  // every unit once. Empty: registration order.
  std::vector<int> unit_order{};
  // By the name transform gives; adapter_config_json (a JSON object) is
  // then required.
  std::function<bool(const std::string& name)> adapter{};
  std::string adapter_config_json;
  // Called on rank 0 after each tensor with (tensor bytes written, total).
  // Unset: rank 0 logs the progress every few seconds of a long export.
  std::function<void(uint64_t done, uint64_t total)> progress{};
  // What the run read or writes elsewhere (the model it started from, a
  // checkpoint root, its data): a destination that is, contains or lies
  // inside one of these, or config_from, is refused, as is one holding a
  // file that an export does not write (tokenizer.json, README.md, ...),
  // before anything is written (Note [an export never destroys what it did
  // not write]). replace: replace such a destination all the same.
  std::vector<std::string> inputs{};
  bool replace = false;
};

struct HfExportReport {
  std::string dir;                 // the published directory
  std::vector<std::string> files;  // written there, by name (rank 0; empty elsewhere)
  uint64_t tensor_bytes = 0;
  double seconds = 0;
};

HfExportReport export_hf(Engine& engine, const std::string& dir, const HfExportOptions& options = {});

}  // namespace zest
