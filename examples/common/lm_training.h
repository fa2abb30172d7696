// What the libtorch language-model examples (gpt, llama) share around their
// model: the validation loss over the corpus's held-out windows, a loss
// averaged over ranks, and running a body on every rank, in-process
// (threads) or under a launcher (mpirun).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include <torch/torch.h>

#include "common/corpus.h"
#include "zest/comm/communicator.h"
#include "zest/engine/engine.h"
#include "zest/torch/torch_module.h"

namespace examples {

// How a model's forward runs a piece that uses one unit's parameters (the
// examples' models take one): directly, or through zest::TorchModule::call.
using UnitRunner =
    std::function<torch::Tensor(const torch::nn::Module& unit, const std::function<torch::Tensor()>& piece)>;
// run(unit, piece) as zt.call(unit, piece): gathers at stage 3.
UnitRunner runner(zest::TorchModule& zt);

// Declares the "no_decay" group on the engine (the 1-D parameters: biases
// and norm weights, as GPT-2, nanoGPT and HF's Trainer train them) and wraps
// the module with these units; parameters whose requires_grad is false are
// registered frozen. Collective (it finalizes the engine).
// `options` carries the rest (deferred construction's placeholders,
// init_from); its units and group are set here.
std::unique_ptr<zest::TorchModule> wrap(zest::Engine& engine, std::shared_ptr<torch::nn::Module> module,
                                        std::vector<std::shared_ptr<torch::nn::Module>> units,
                                        zest::TorchModuleOptions options = {});

struct MicroStep {
  float loss = 0.0f;  // this rank's mean loss over its rows
  zest::StepResult result;
};
// Backward of this rank's `loss` into the engine, then zt.step().
MicroStep backward_and_step(zest::TorchModule& zt, const torch::Tensor& loss);

// Logits [rows, context, vocab] of token windows [rows, context], through
// the wrapped model (gathering at stage 3).
using LogitsFn = std::function<torch::Tensor(const torch::Tensor& tokens)>;

// How many validation windows of `context` bytes a run evaluates: at most
// `requested` (--val-windows), as many as the split has, rounded down to a
// multiple of the ranks. Throws a zest::Error naming the flag to change
// when that leaves none.
int64_t validation_windows(const Corpus& corpus, int64_t requested, int64_t context, int world);

// The mean loss per token over the first `windows` validation windows
// (Corpus::validation_windows; a multiple of the world size, else
// std::invalid_argument), each rank taking a contiguous share and the
// per-rank sums added in rank order: the same value on every rank, and the
// same bits at every stage for a given world size. Collective.
double validation_loss(zest::Engine& engine, const LogitsFn& logits, const Corpus& corpus, int64_t windows,
                       int64_t context);
// The same with the summed token losses of windows [rows, context] against
// their targets from `loss_sum` (a model whose logits are split or on
// another rank), which must give every rank of the engine's group its own
// share's sum.
using LossSumFn = std::function<double(const torch::Tensor& tokens, const torch::Tensor& targets)>;
double validation_loss(zest::Engine& engine, const LossSumFn& loss_sum, const Corpus& corpus, int64_t windows,
                       int64_t context);

// This rank's mean loss, averaged over the ranks in rank order (the same on
// every rank). Collective.
float mean_over_ranks(zest::Engine& engine, float loss);

// body(comm) on each of `ranks` in-process ranks (threads, all on
// `device`), or once on `launched` when given (one process per rank, from
// the launcher).
void run_on_ranks(zest::Communicator* launched, int ranks, const std::function<void(zest::Communicator&)>& body,
                  const zest::CommOptions& comm = {}, zest::Device device = zest::Device::host());

}  // namespace examples
