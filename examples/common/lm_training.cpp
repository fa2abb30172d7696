#include "common/lm_training.h"

#include <algorithm>
#include <array>
#include <bit>
#include <stdexcept>

#include <fmt/format.h>

#include "zest/comm/inprocess_comm.h"
#include "zest/core/check.h"

namespace examples {

UnitRunner runner(zest::TorchModule& zt) {
  return [&zt](const torch::nn::Module& unit, const std::function<torch::Tensor()>& piece) {
    return zt.call(unit, piece);
  };
}

std::unique_ptr<zest::TorchModule> wrap(zest::Engine& engine, std::shared_ptr<torch::nn::Module> module,
                                        std::vector<std::shared_ptr<torch::nn::Module>> units,
                                        zest::TorchModuleOptions options) {
  engine.add_param_group("no_decay", 0.0f);
  options.units = std::move(units);
  options.group = [](const std::string&, const torch::Tensor& p) {
    return p.dim() < 2 ? std::string("no_decay") : std::string("default");
  };
  return std::make_unique<zest::TorchModule>(engine, std::move(module), std::move(options));
}

MicroStep backward_and_step(zest::TorchModule& zt, const torch::Tensor& loss) {
  zt.scale(loss).backward();
  MicroStep out;
  out.loss = loss.item<float>();
  out.result = zt.step();
  return out;
}

double validation_loss(zest::Engine& engine, const LogitsFn& logits_of, const Corpus& corpus, int64_t windows,
                       int64_t context) {
  return validation_loss(
      engine,
      [&](const torch::Tensor& tokens, const torch::Tensor& targets) {
        const torch::Tensor logits = logits_of(tokens);
        return torch::nn::functional::cross_entropy(
                   logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}),
                   torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
            .to(torch::kDouble)
            .item<double>();
      },
      corpus, windows, context);
}

double validation_loss(zest::Engine& engine, const LossSumFn& loss_sum, const Corpus& corpus, int64_t windows,
                       int64_t context) {
  const int64_t world = engine.comm().size(), rank = engine.comm().rank();
  // Equal shares, so that every rank runs the same forwards: at stage 3 each
  // one's gathers are collective.
  if (windows < world || windows % world != 0) {
    throw std::invalid_argument(fmt::format("{} validation windows do not divide into {} ranks", windows, world));
  }
  const int64_t first = windows / world * rank, last = first + windows / world;
  // Bounded chunks: the logits of a chunk are chunk x context x vocab floats.
  constexpr int64_t kChunk = 16;
  const torch::Device device = zest::torch_device(engine.comm().device());
  double sum = 0.0;
  {
    torch::NoGradGuard no_grad;
    for (int64_t w = first; w < last; w += kChunk) {
      const Batch b = corpus.validation_windows(w, std::min(kChunk, last - w), context);
      sum += loss_sum(b.inputs.to(device), b.targets.to(device));
      engine.end_forward();  // stage 3: each chunk's forward replays the inference order
    }
  }
  const std::array<int64_t, 1> mine = {std::bit_cast<int64_t>(sum)};
  const std::vector<int64_t> all = engine.all_gather_scalars(mine);
  double total = 0.0;
  for (int64_t bits : all) total += std::bit_cast<double>(bits);
  return total / static_cast<double>(windows * context);
}

float mean_over_ranks(zest::Engine& engine, float loss) {
  const std::array<int64_t, 1> mine = {std::bit_cast<int32_t>(loss)};
  const std::vector<int64_t> all = engine.all_gather_scalars(mine);
  float sum = 0.0f;
  for (int64_t bits : all) sum += std::bit_cast<float>(static_cast<int32_t>(bits));
  return sum / static_cast<float>(all.size());
}

int64_t validation_windows(const Corpus& corpus, int64_t requested, int64_t context, int world) {
  const int64_t available = corpus.validation_window_count(context, requested);
  ZEST_CHECK(requested >= world, "--val-windows {} is fewer than the {} ranks, which each take a share: give at least {}",
             requested, world, world);
  ZEST_CHECK(available >= world,
             "the validation split has {} windows of {} bytes, fewer than the {} ranks: use a smaller --ranks or "
             "--context, or a larger --data",
             available, context, world);
  return std::min(requested, available) / world * world;
}

void run_on_ranks(zest::Communicator* launched, int ranks, const std::function<void(zest::Communicator&)>& body,
                  const zest::CommOptions& comm, zest::Device device) {
  if (launched != nullptr) {
    body(*launched);
  } else {
    zest::run_inprocess(ranks, body, device, comm);
  }
}

}  // namespace examples
