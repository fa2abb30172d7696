// A libtorch user's training loop, with the lines ZEST adds marked: trained
// at stages 0-3 on 2 in-process ranks, each rank on its half of the batch.
// The losses must fall and be the same at every stage, to the bit.
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <mutex>

#include <zest/comm/inprocess_comm.h>      // ZEST
#include <zest/memory/raw_allocator.h>     // ZEST
#include <zest/torch/torch_module.h>       // ZEST

struct Net : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(4, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 1));
  }
  torch::Tensor forward(torch::Tensor x, zest::TorchModule& zt) {
    x = torch::relu(zt.forward(fc1, x));   // was fc1->forward(x): gathers fc1 at stage 3
    return zt.forward(fc2, x);
  }
};

std::vector<double> train(int stage) {
  std::vector<double> losses;
  std::mutex seeding;
  zest::run_inprocess(2, [&](zest::Communicator& comm) {
    std::shared_ptr<Net> model;
    {
      const std::lock_guard<std::mutex> lock(seeding);  // ranks are threads sharing torch's generator
      torch::manual_seed(0);
      model = std::make_shared<Net>();
    }
    zest::EngineConfig config;                                     // ZEST
    config.zero.stage = stage;                                     // ZEST
    config.zero.stage3_param_persistence_threshold = 0;            // ZEST: shard even this small model
    config.optimizer.lr = 0.01f;                                   // ZEST: AdamW
    zest::CachingAllocator alloc(zest::make_host_allocator());     // ZEST
    zest::Engine engine(config, comm, alloc, zest::Stream::default_for(comm.device()));  // ZEST
    zest::TorchModule zt(engine, model);                           // ZEST

    torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(42);
    for (int step = 0; step < 60; ++step) {
      const torch::Tensor x = torch::randn({16, 4}, gen);
      const torch::Tensor y = 0.5 * x.sum(1, true);
      const torch::Tensor mine = x.narrow(0, 8 * comm.rank(), 8);
      torch::Tensor loss = torch::mse_loss(model->forward(mine, zt), y.narrow(0, 8 * comm.rank(), 8));
      zt.scale(loss).backward();                                   // ZEST: was loss.backward()
      const zest::StepResult r = zt.step();                        // ZEST: was optimizer.step()
      if (comm.rank() == 0 && r.applied) losses.push_back(loss.item<double>());
    }
  });
  return losses;
}

int main() {
  torch::set_num_threads(1);
  std::vector<double> first;
  for (int stage = 0; stage <= 3; ++stage) {
    const std::vector<double> losses = train(stage);
    std::printf("stage %d: loss %.4f -> %.4f\n", stage, losses.front(), losses.back());
    if (stage == 0) first = losses;
    if (losses.size() != first.size() || std::memcmp(losses.data(), first.data(), losses.size() * sizeof(double)) != 0) {
      std::printf("stage %d's losses differ from stage 0's\n", stage);
      return 1;
    }
  }
  const auto mean10 = [](const double* p) { double s = 0; for (int i = 0; i < 10; ++i) s += p[i]; return s / 10; };
  if (!(mean10(first.data() + first.size() - 10) < 0.5 * mean10(first.data()))) {
    std::printf("the loss did not fall\n");
    return 1;
  }
  std::printf("zest torch consumer ok: stages 0-3 identical\n");
  return 0;
}
