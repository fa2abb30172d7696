// What the example models' mesh tests (test_gpt_mesh.cpp, test_llama_mesh.cpp)
// share: a run of a model on a dp x tp x pp mesh of in-process ranks through
// examples::MeshTrainer (or on one rank without a mesh), the checks of a
// mesh run against the one-rank run and across ZeRO stages, and the
// comparison of exported files.
//
// A run is kSteps AdamW steps of kMicroBatches micro-batches (the
// pipeline's) of the test corpus, clipped by the global gradient norm at
// 0.05, below every norm seen, so that every step clips and the norm's sum
// over the mesh is in the weights; then the validation loss and the next
// token's logits after "Look ". lr 1e-2 and eps 1e-6 (test_gpt_mesh.cpp
// says why: the tolerances of check_against_whole).
#pragma once

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/corpus.h"
#include "common/mesh_trainer.h"
#include "common/staged_lm.h"
#include "torch_doctest.h"
#include "zest/mesh/device_mesh.h"
#include "zest/torch/torch_module_io.h"

namespace mesh_run {

constexpr int64_t kRows = 8;  // global batch
constexpr int64_t kContext = 16;
constexpr int kMicroBatches = 2;
constexpr int kSteps = 3;

struct Run {
  std::vector<float> losses;  // per step, this dp rank's
  std::vector<double> norms;
  double val_loss = 0.0;
  torch::Tensor next_logits;  // after "Look ", the whole vocabulary
  std::string sample;         // Options::sample's text, when given
  std::map<std::string, torch::Tensor> masters;  // this rank's part, in the parameters' shapes
  int tp_rank = 0, tp_size = 1;                   // the part of each parameter it holds
};

// One rank's model: `module` keeps it alive, `lm` drives it.
struct Model {
  std::shared_ptr<torch::nn::Module> module;
  examples::StagedLm* lm = nullptr;
};

struct Options {
  // The model of `placement` with the test's seed, and its TorchModule on
  // `engine` (the example's wrap()).
  std::function<Model(const examples::Placement& placement)> build;
  std::function<std::unique_ptr<zest::TorchModule>(zest::Engine& engine, const Model& model)> wrap;
  uint64_t seed = 0;  // the batches'
  zest::PipelineKind schedule = zest::PipelineKind::k1F1B;
  // Steps [first, last); a checkpoint loaded from `load` before the first
  // and saved to `save` after the last, when given.
  int first = 0;
  int last = kSteps;
  std::string load, save;
  // Called after the wrap (before the trainer), before the first step
  // ("before") and after the last ("after"), when given.
  std::function<void(zest::TorchModule&, Model&)> after_wrap;
  std::function<void(zest::TorchModule&, const char* when)> on_weights;
  // A text generated after training, when given (Run::sample).
  std::function<std::string(examples::MeshTrainer&)> sample;
};

// The engine configuration of a run at `stage`, gradients reduced in
// buckets of `bucket` elements (several per step).
zest::EngineConfig config(int stage, int64_t bucket);

// Every rank's run on `shape` (a mesh; none for the plain one-rank path).
std::vector<Run> train(const std::string& corpus_text, std::optional<zest::MeshShape> shape, int stage,
                       int64_t bucket, const Options& options);

// Every rank's parameters (Run::masters, with its tp rank) after
// zt.import_hf(dir) into the model Options::build makes on `shape`, at ZeRO
// stage 3; nothing trains.
std::vector<Run> import_on_mesh(const std::string& dir, const zest::MeshShape& shape, int64_t bucket,
                                const Options& options);

// Tensor-parallel rank r's part (of t) of a whole parameter: the model's
// part_of_whole.
using PartOfWhole = std::function<torch::Tensor(const std::string& name, const torch::Tensor& whole, int r, int t)>;

// Each rank of a mesh run against the one-rank run, within 1e-5 (relative
// on losses, norms and the validation loss, absolute on weights and
// logits): its part of every parameter, the norms, its dp rank's losses
// (for dp = 1 only: with more, a rank's rows are a different mean), the
// validation loss, the logits and the sample (the same text).
void check_against_whole(const std::vector<Run>& mesh, const Run& whole, int dp, const PartOfWhole& part_of_whole);

// Every rank of `b` holds the bits of the same rank of `a`.
void check_same_bits(const std::vector<Run>& a, const std::vector<Run>& b);

// Every dp x tp x pp in {1,2}^3: train(shape, 0) against `whole`
// (check_against_whole), and train(shape, s) for s = 1, 2, 3 with stage 0's
// bits.
using TrainOnMesh = std::function<std::vector<Run>(const zest::MeshShape& shape, int stage)>;
void check_every_mesh(const Run& whole, const TrainOnMesh& train, const PartOfWhole& part_of_whole);

// Each parameter of `part` is tp rank r's part (of t) of `whole`'s of the
// same name, bit for bit; returns the part's names in order.
std::vector<std::string> check_parts_of(const torch::nn::Module& whole, const torch::nn::Module& part, int r, int t,
                                        const PartOfWhole& part_of_whole);

double relative(double a, double b);

// The message of the std::invalid_argument fn throws; "(no error)" when none.
template <typename Fn>
std::string invalid_argument_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

std::string file_bytes(const std::filesystem::path& path);
// Every file of a directory, by name.
std::map<std::string, std::string> dir_bytes(const std::filesystem::path& dir);
// The same tensors (names, shapes, dtypes, in order), their values within
// `tolerance` (absolute).
void check_close_files(const std::filesystem::path& a, const std::filesystem::path& b, double tolerance);
// Two Hugging Face directories: the same files; the safetensors shards'
// tensors within `tolerance`, every other file (config.json, the index)
// byte for byte.
void check_close_hf_dirs(const std::filesystem::path& a, const std::filesystem::path& b, double tolerance);

}  // namespace mesh_run
