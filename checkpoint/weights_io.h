// The model's weights as one safetensors file, out and in, with the names and
// shapes registered:
//
//   // zest-example: prelude=engine
//   zest::export_weights(engine, "model.safetensors", {.dtype = zest::DType::kBFloat16});
//   zest::import_weights(engine, "pretrained.safetensors");   // after finalize()
//
// Export never holds the whole model: one unit is gathered at a time and
// written in order (rank 0 writes; the others send their shards). On a
// tensor x pipeline mesh it writes the whole model, each unit joined from
// the tp x pp ranks' parts (whole_model.h): the file one rank holding the
// whole model writes. Import reads on every rank only the elements of the
// shard it owns, and refuses a mesh.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zest/engine/engine.h"
#include "zest/checkpoint/safetensors.h"

namespace zest {

struct WeightsExportOptions {
  DType dtype = DType::kFloat32;  // fp32, bf16 or fp16
  // Called on rank 0 with (bytes written, total), after each parameter.
  // Unset: files of 1 GiB or more log every tenth at info level.
  std::function<void(uint64_t, uint64_t)> progress{};
};

// The file's tensors: every registered parameter in layout order.
std::vector<SafetensorsEntry> weights_entries(const ModelLayout& layout, DType dtype);

// fp32 values as the bytes of `dtype` (fp32, bf16 or fp16, rounded to
// nearest even), as a safetensors file stores them.
std::vector<std::byte> encode_weights(std::span<const float> values, DType dtype);

// Collective (over the whole mesh). The fp32 master weights, converted to
// options.dtype.
void export_weights(Engine& engine, const std::string& path, const WeightsExportOptions& options = {});

struct WeightsImportOptions {
  // Tensors stored in another floating dtype than fp32 are converted; false
  // makes that an error.
  bool convert_dtypes = true;
  // Tensors in the file that the model does not register are an error
  // unless this is set.
  bool ignore_unknown = false;
  // Registered parameters that may be absent from the file (LoRA adapters
  // over a base model's weights): they keep the values they have.
  std::function<bool(const std::string& name)> keep_missing{};
};

// Collective. Every registered parameter must be in the file with its shape
// (unless keep_missing accepts its absence);
// non-finite values are an error. Sets the master weights and parameters,
// zeroes the optimizer state and restarts the step count: a fine-tuning run's
// starting point.
void import_weights(Engine& engine, const std::string& path, const WeightsImportOptions& options = {});

// Where load_owned_weights finds one registered parameter: a tensor of an
// open file, whose shape and dtype the caller has checked, or nowhere (file
// null): the parameter keeps the values it has.
struct OwnedWeightSource {
  const SafetensorsFile* file = nullptr;
  std::string tensor;
};

// Parameters holding a NaN or Inf in this rank's part: (name, index in the
// whole tensor of the first such element found).
using NonFiniteValues = std::vector<std::pair<std::string, uint64_t>>;

// Threads per rank that read and store a load's pieces (import_weights,
// HfImportOptions::read_threads' default): enough to keep the page cache or
// a fast disk busy.
constexpr int kDefaultReadThreads = 4;

// Not collective. This rank's shard of each unit in turn: of each parameter
// only the elements inside the shard (at stages 1-3 the ranks together read
// each file about once; at stage 0 every rank reads everything). Each
// unit's owned byte ranges are read as stored and checked, and a unit
// holding no non-finite value goes straight into the engine's shard
// (Engine::begin_shard_load: master weights, compute-dtype parameters,
// zeroed optimizer state) while the next unit is read (Note [one pass from
// the file into the shard] in weights_load.cpp; a unit in the compute dtype
// is read straight into the parameters). A unit holding one keeps its
// weights (a frozen unit read in place is zeroed: Engine::abandon_shard_load)
// with its optimizer state zeroed, and its parameters are returned; so does
// a unit in flight when a read fails. Parameters without a source keep their
// values. Memory: two units' shards as stored (none for a unit read in
// place; for bf16 one fp32 shard) and a few KiB per thread. finish_loaded_weights
// (collective) then ends it as finish_start_from_weights does. `progress`
// is called on the calling thread with (tensor bytes read, tensor bytes
// this rank reads in all); `threads` threads read and store. `map_files`:
// a file's bytes are looked at in the page cache where they are (mapped,
// file_view.h) instead of read with pread into buffers
// (HfImportOptions::map_files says which is faster where).
NonFiniteValues load_owned_weights(Engine& engine, const std::function<OwnedWeightSource(const ParamLayout&)>& source,
                                   const std::function<void(uint64_t, uint64_t)>& progress = {}, int threads = 1,
                                   bool map_files = false);
void finish_loaded_weights(Engine& engine);
// Collective: load_owned_weights on every rank (`what` names the step in
// errors). Where any rank fails, every rank throws, after rebuilding its
// parameters from the shards as they are (finish_start_from_weights), so the
// engine stays consistent; else finish_loaded_weights follows.
NonFiniteValues load_weights_on_every_rank(Engine& engine, const char* what,
                                           const std::function<OwnedWeightSource(const ParamLayout&)>& source,
                                           const std::function<void(uint64_t, uint64_t)>& progress, int threads,
                                           bool map_files = false);
// Collective. The non-finite values every rank found (load_owned_weights),
// agreed: each parameter holding one anywhere with the lowest element index
// found, in the layout's order, the same list on every rank.
NonFiniteValues agree_non_finite(Engine& engine, const NonFiniteValues& mine);

// Collective. What import_weights and a weights-only load_checkpoint do with
// the values they read: `masters[u]` (this rank's shard of unit u) become the
// master weights and parameters, the optimizer state is zeroed and the step
// counts restart at 0; the loss scaler and a set_lr() value are kept.
void start_from_weights(Engine& engine, const std::vector<std::vector<float>>& masters);
// start_from_weights in steps, for a caller that reads one unit at a time:
// unit u's master shard (not collective), then, once every unit read is in,
// the progress and parameters (collective).
void start_unit_from_weights(Engine& engine, int unit, std::span<const float> master);
void finish_start_from_weights(Engine& engine);

}  // namespace zest
