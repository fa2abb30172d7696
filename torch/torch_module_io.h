// A TorchModule's checkpoints and weights in and out: the engine's
// functions (checkpoint.h, weights_io.h, hf_import.h, hf_export.h) under
// the module's parameter names, with the module's view of the values kept
// current after a load or import. Collective, as the engine's are.
//
//   // zest-example: prelude=torch_module
//   zest::save_checkpoint(zt, "ckpt");                     // any world size loads it
//   zest::load_checkpoint(zt, "ckpt");
//   zest::HfExportReport r = zest::export_hf(zt, "out_hf"); // a Hugging Face directory
#pragma once

#include <string>

#include "zest/checkpoint/checkpoint.h"
#include "zest/checkpoint/weights_io.h"
#include "zest/hf/hf_export.h"
#include "zest/hf/hf_import.h"
#include "zest/torch/torch_module.h"

namespace zest {

// ZEST checkpoints (save_checkpoint / load_checkpoint of the engine); the
// tag saved or loaded.
std::string save_checkpoint(TorchModule& tm, const std::string& root, const CheckpointOptions& options = {});
std::string load_checkpoint(TorchModule& tm, const std::string& root, const CheckpointOptions& options = {});
// The fp32 master weights (options.dtype: narrowed) to one safetensors file.
void export_weights(TorchModule& tm, const std::string& path, const WeightsExportOptions& options = {});
// Weights from one safetensors file (import_weights) or a Hugging Face
// directory (import_hf), and out as a Hugging Face directory (export_hf).
// A fine-tuning run's start: the optimizer state restarts. Parameters
// absent from the file are an error unless options.keep_missing /
// options.allow_missing accepts them (adapters): those keep their values.
void import_weights(TorchModule& tm, const std::string& path, const WeightsImportOptions& options = {});
HfImportReport import_hf(TorchModule& tm, const std::string& dir, const HfImportOptions& options = {});
HfExportReport export_hf(TorchModule& tm, const std::string& dir, const HfExportOptions& options = {});

}  // namespace zest
