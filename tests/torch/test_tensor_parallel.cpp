// Tensor parallelism (torch/tensor_parallel.h) on in-process ranks: each
// layer split over tp = 2 against the whole layer on one rank (forward,
// backward, initialization), sequence parallelism against the plain split,
// the vocabulary-parallel loss against torch's cross-entropy, and a model
// trained on dp x tp = 2 x 2 ranks through TorchModule against the same
// model on one rank, bit for bit across ZeRO stages within the mesh.
//
// Tolerances. Splitting a layer changes only where sums are split: a
// row-parallel layer adds two partial products of K/2 terms where the whole
// layer adds K terms in one (BLAS) order; cross-entropy's sum of
// exponentials likewise. Values here are O(1) with K <= 32, so each result
// moves by a few fp32 ulps of O(1) (eps = 1.2e-7): 2e-6 relative to the
// larger of 1 and the values' magnitude (sums over the sequence reach ~20). Lookups,
// splits, gathers and maxima are exact and compared bit for bit. Training
// for 3 AdamW steps carries those differences into the weights scaled by
// lr (1e-2) over sqrt(v) ~ |g|: updates move by their relative error, well
// under 1e-5 of weights O(1): 1e-5 absolute.
#include <algorithm>
#include <mutex>

#include "torch_doctest.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/engine/engine.h"
#include "zest/memory/caching_allocator.h"
#include "zest/memory/raw_allocator.h"
#include "zest/mesh/device_mesh.h"
#include "zest/torch/tensor_parallel.h"
#include "zest/torch/torch_module.h"
#include "../error_of.h"

namespace test_tensor_parallel {

using namespace zest;

namespace {

constexpr double kSplitSum = 2e-6;
constexpr double kTrained = 1e-5;

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

// Within kSplitSum of `b`, relative to the larger of 1 and b's magnitude.
bool split_close(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(1.0, b.abs().max().item<double>());
  return max_abs_diff(a, b) <= kSplitSum * scale;
}

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && torch::equal(a.contiguous(), b.contiguous());
}

// One lock for every build from torch's global generator (in-process ranks
// are threads of one process): a function's own, not a template's, which
// would have one per instantiation.
std::mutex& generator_mutex() {
  static std::mutex mutex;
  return mutex;
}

// Builds under a seeded global generator, one thread at a time.
template <typename F>
auto seeded(uint64_t seed, F&& build) {
  const std::lock_guard<std::mutex> lock(generator_mutex());
  torch::manual_seed(seed);
  return build();
}

torch::Tensor randn(std::vector<int64_t> shape, uint64_t seed) {
  torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(seed);
  return torch::randn(shape, gen);
}

// Rank r's part of `whole` along `dim` for tp ranks.
torch::Tensor part(const torch::Tensor& whole, int64_t dim, int r, int tp) {
  return whole.chunk(tp, dim)[static_cast<size_t>(r)];
}

}  // namespace

TEST_CASE("tp mappings: values and gradients of each collective pair") {
  run_inprocess(2, [](Communicator& tp) {
    torch::set_num_threads(1);
    const int r = tp.rank();
    // A value that differs by rank, so a sum, a gather and a split each show.
    const torch::Tensor x = (torch::arange(6, torch::kFloat).reshape({2, 3}) + 10 * r).requires_grad_();
    const torch::Tensor w = randn({2, 3}, 7);  // the same on both ranks: d(sum(y * w)) / dy = w

    torch::Tensor y = tp::reduce_from_region(x, tp);
    CHECK(same_bits(y, torch::arange(6, torch::kFloat).reshape({2, 3}) * 2 + 10));
    (y * w).sum().backward();
    CHECK(same_bits(x.grad(), w));  // backward: the identity
    x.mutable_grad() = torch::Tensor();

    y = tp::copy_to_region(x, tp);
    CHECK(same_bits(y, x));
    (y * w * (r + 1)).sum().backward();
    CHECK(same_bits(x.grad(), w * 3));  // backward: the sum of w * 1 and w * 2
    x.mutable_grad() = torch::Tensor();

    y = tp::gather_from_region(x, tp, -1);  // [2, 6]: rank 0's columns, then rank 1's
    CHECK(same_bits(y, torch::cat({torch::arange(6, torch::kFloat).reshape({2, 3}),
                                   torch::arange(6, torch::kFloat).reshape({2, 3}) + 10},
                                  1)));
    const torch::Tensor w6 = randn({2, 6}, 8);
    (y * w6).sum().backward();
    CHECK(same_bits(x.grad(), part(w6, 1, r, 2)));
    x.mutable_grad() = torch::Tensor();

    y = tp::scatter_to_region(x, tp, 0);  // [1, 3]: this rank's row
    CHECK(same_bits(y, x.detach().narrow(0, r, 1)));
    const torch::Tensor w1 = randn({1, 3}, 9 + static_cast<uint64_t>(r));
    (y * w1).sum().backward();
    // backward all-gathers the rows' gradients: row i from rank i.
    CHECK(same_bits(x.grad(), torch::cat({randn({1, 3}, 9), randn({1, 3}, 10)}, 0)));
    x.mutable_grad() = torch::Tensor();

    y = tp::gather_from_sequence_region(x, tp, 0);  // [4, 3]
    (y * randn({4, 3}, 11)).sum().backward();
    // backward reduce-scatters: both ranks' w summed, this rank's rows.
    CHECK(same_bits(x.grad(), part(randn({4, 3}, 11) * 2, 0, r, 2)));
    x.mutable_grad() = torch::Tensor();

    y = tp::reduce_scatter_to_sequence_region(x, tp, 0);  // [1, 3]: row r of the sum
    CHECK(same_bits(y, (torch::arange(6, torch::kFloat).reshape({2, 3}) * 2 + 10).narrow(0, r, 1)));
    (y * w1).sum().backward();
    CHECK(same_bits(x.grad(), torch::cat({randn({1, 3}, 9), randn({1, 3}, 10)}, 0)));
  });
}

TEST_CASE("tp mappings refuse a dimension the ranks do not divide, naming it") {
  const std::string e = test::error_of([] {
    run_inprocess(2, [](Communicator& tp) {
      torch::set_num_threads(1);
      (void)tp::reduce_scatter_to_sequence_region(torch::ones({2, 3}), tp, 1);
    });
  });
  CHECK(e.find("dimension 1 of size 3") != std::string::npos);
  CHECK(e.find("2 tensor-parallel ranks") != std::string::npos);
}

TEST_CASE("tp layers start from the whole layer's weights drawn after the same seed") {
  auto whole_linear = seeded(5, [] { return torch::nn::Linear(8, 12); });
  auto whole_embedding = seeded(6, [] { return torch::nn::Embedding(10, 4); });
  run_inprocess(2, [&](Communicator& tp) {
    torch::set_num_threads(1);
    const int r = tp.rank();
    auto col = seeded(5, [&] { return tp::ColumnParallelLinear(tp, tp::ParallelLinearOptions(8, 12)); });
    auto row = seeded(5, [&] { return tp::RowParallelLinear(tp, tp::ParallelLinearOptions(8, 12)); });
    auto emb = seeded(6, [&] { return tp::VocabParallelEmbedding(tp, tp::VocabParallelEmbeddingOptions(10, 4)); });
    CHECK(same_bits(col->weight, part(whole_linear->weight, 0, r, 2)));
    CHECK(same_bits(col->bias, part(whole_linear->bias, 0, r, 2)));
    // Row-parallel: the whole layer of out 12, in 8 drawn, columns kept.
    CHECK(same_bits(row->weight, part(whole_linear->weight, 1, r, 2)));
    CHECK(same_bits(row->bias, whole_linear->bias));
    CHECK(same_bits(emb->weight, part(whole_embedding->weight, 0, r, 2)));
    CHECK(emb->vocab_start() == 5 * r);
  });
}

TEST_CASE("column then row parallel: the whole MLP's output and gradients, on every tp rank") {
  auto up = seeded(21, [] { return torch::nn::Linear(8, 32); });
  auto down = seeded(22, [] { return torch::nn::Linear(32, 8); });
  const torch::Tensor x0 = randn({6, 8}, 23);
  const torch::Tensor x = x0.clone().requires_grad_();
  const torch::Tensor target = randn({6, 8}, 24);
  const torch::Tensor y = down(torch::gelu(up(x)));
  torch::mse_loss(y, target).backward();

  for (const bool gather_twice : {false, true}) {
    CAPTURE(gather_twice);
    run_inprocess(2, [&](Communicator& tp) {
      torch::set_num_threads(1);
      const int r = tp.rank();
      auto col = seeded(21, [&] { return tp::ColumnParallelLinear(tp, tp::ParallelLinearOptions(8, 32).gather_output(gather_twice)); });
      auto row = seeded(22, [&] {
        return tp::RowParallelLinear(tp, tp::ParallelLinearOptions(32, 8).input_is_parallel(!gather_twice));
      });
      const torch::Tensor xr = x0.clone().requires_grad_();
      const torch::Tensor yr = row(torch::gelu(col(xr)));
      CHECK(split_close(yr, y));
      torch::mse_loss(yr, target).backward();
      CHECK(split_close(xr.grad(), x.grad()));
      CHECK(split_close(col->weight.grad(), part(up->weight.grad(), 0, r, 2)));
      CHECK(split_close(col->bias.grad(), part(up->bias.grad(), 0, r, 2)));
      CHECK(split_close(row->weight.grad(), part(down->weight.grad(), 1, r, 2)));
      CHECK(split_close(row->bias.grad(), down->bias.grad()));
      // The replicated bias's gradient is the same bits on both ranks (an
      // all-reduce of its bits by max equals them exactly when they agree).
      torch::Tensor g = row->bias.grad().clone();
      const torch::Tensor mine = g.clone();
      tp.all_reduce(g.data_ptr(), g.data_ptr(), static_cast<size_t>(g.numel()), DType::kFloat32, ReduceOp::kMax,
                    Stream::default_for(tp.device()));
      CHECK(same_bits(g, mine));
    });
  }
}

TEST_CASE("tp layers on one rank are torch's layers, bit for bit") {
  auto whole = seeded(31, [] { return torch::nn::Linear(8, 12); });
  const torch::Tensor x = randn({5, 8}, 32);
  run_inprocess(1, [&](Communicator& tp) {
    auto col = seeded(31, [&] { return tp::ColumnParallelLinear(tp, tp::ParallelLinearOptions(8, 12)); });
    auto row = seeded(31, [&] { return tp::RowParallelLinear(tp, tp::ParallelLinearOptions(8, 12)); });
    CHECK(same_bits(col(x), whole(x)));
    CHECK(same_bits(row(x), whole(x)));
  });
}

TEST_CASE("vocab-parallel embedding: the whole lookup and its gradient, bit for bit") {
  auto whole = seeded(41, [] { return torch::nn::Embedding(10, 4); });
  const torch::Tensor tokens = torch::tensor({{0, 9, 4, 5}, {5, 5, 1, 8}}, torch::kLong);
  const torch::Tensor w = randn({2, 4, 4}, 42);
  (whole(tokens) * w).sum().backward();
  run_inprocess(2, [&](Communicator& tp) {
    torch::set_num_threads(1);
    auto emb = seeded(41, [&] { return tp::VocabParallelEmbedding(tp, tp::VocabParallelEmbeddingOptions(10, 4)); });
    const torch::Tensor out = emb(tokens);
    CHECK(same_bits(out, whole(tokens)));
    (out * w).sum().backward();
    CHECK(same_bits(emb->weight.grad(), part(whole->weight.grad(), 0, tp.rank(), 2)));
  });
}

TEST_CASE("vocab-parallel cross-entropy: torch's cross-entropy of the gathered logits, and its gradient") {
  const torch::Tensor logits0 = randn({3, 5, 12}, 51) * 3;
  const torch::Tensor target = torch::randint(12, {3, 5}, torch::make_generator<torch::CPUGeneratorImpl>(52));
  const torch::Tensor logits = logits0.clone().requires_grad_();
  const torch::Tensor weights = randn({3, 5}, 53);
  const torch::Tensor loss = torch::nn::functional::cross_entropy(
      logits.reshape({-1, 12}), target.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone)).reshape({3, 5});
  (loss * weights).sum().backward();
  for (const int ranks : {1, 2, 3}) {
    CAPTURE(ranks);
    run_inprocess(ranks, [&](Communicator& tp) {
      torch::set_num_threads(1);
      const torch::Tensor mine = part(logits0, -1, tp.rank(), ranks).clone().requires_grad_();
      const torch::Tensor l = tp::vocab_parallel_cross_entropy(mine, target, tp);
      CHECK(split_close(l, loss));
      (l * weights).sum().backward();
      CHECK(split_close(mine.grad(), part(logits.grad(), -1, tp.rank(), ranks)));
    });
  }
  const std::string e = test::error_of([&] {
    run_inprocess(1, [&](Communicator& tp) { (void)tp::vocab_parallel_cross_entropy(logits0, target.narrow(1, 0, 4), tp); });
  });
  CHECK(e.find("target's shape [3, 4] must be the logits' [3, 5, 12]") != std::string::npos);
}

TEST_CASE("sequence parallelism: the plain tp block's output and gradients, each rank its part of the sequence") {
  // [sequence 4, batch 3, hidden 8]: a pre-norm MLP block with a residual,
  // the norm in the sequence-split region.
  const torch::Tensor x0 = randn({4, 3, 8}, 61);
  const torch::Tensor target = randn({4, 3, 8}, 62);
  struct Whole {
    torch::nn::LayerNorm ln{torch::nn::LayerNormOptions({8})};
    torch::nn::Linear up{nullptr}, down{nullptr};
  };
  Whole whole;
  whole.up = seeded(63, [] { return torch::nn::Linear(8, 16); });
  whole.down = seeded(64, [] { return torch::nn::Linear(16, 8); });
  const torch::Tensor x = x0.clone().requires_grad_();
  const torch::Tensor y = x + whole.down(torch::gelu(whole.up(whole.ln(x))));
  torch::mse_loss(y, target, at::Reduction::Sum).backward();

  run_inprocess(2, [&](Communicator& tp) {
    torch::set_num_threads(1);
    const int r = tp.rank();
    tp::SequenceParallelLayerNorm ln(tp, 8);
    auto up = seeded(63, [&] { return tp::ColumnParallelLinear(tp, tp::ParallelLinearOptions(8, 16).sequence_parallel(true)); });
    auto down = seeded(64, [&] { return tp::RowParallelLinear(tp, tp::ParallelLinearOptions(16, 8).sequence_parallel(true)); });
    const torch::Tensor xr = part(x0, 0, r, 2).clone().requires_grad_();
    const torch::Tensor yr = xr + down(torch::gelu(up(ln(xr))));
    CHECK(split_close(yr, part(y, 0, r, 2)));
    torch::mse_loss(yr, part(target, 0, r, 2), at::Reduction::Sum).backward();
    CHECK(split_close(xr.grad(), part(x.grad(), 0, r, 2)));
    // The replicated parameters' gradients come out whole on each rank.
    CHECK(split_close(ln->weight.grad(), whole.ln->weight.grad()));
    CHECK(split_close(ln->bias.grad(), whole.ln->bias.grad()));
    CHECK(split_close(down->bias.grad(), whole.down->bias.grad()));
    CHECK(split_close(up->weight.grad(), part(whole.up->weight.grad(), 0, r, 2)));
    CHECK(split_close(down->weight.grad(), part(whole.down->weight.grad(), 1, r, 2)));
  });
}

TEST_CASE("tp layers refuse sizes the ranks do not divide, naming the size") {
  const std::string e = test::error_of([] {
    run_inprocess(2, [](Communicator& tp) { (void)tp::ColumnParallelLinear(tp, tp::ParallelLinearOptions(8, 7)); });
  });
  CHECK(e.find("ColumnParallelLinear's out_features is 7") != std::string::npos);
  const std::string v = test::error_of([] {
    run_inprocess(2, [](Communicator& tp) {
      (void)tp::VocabParallelEmbedding(tp, tp::VocabParallelEmbeddingOptions(51, 4));
    });
  });
  CHECK(v.find("num_embeddings is 51") != std::string::npos);
  CHECK(v.find("make_vocab_size_divisible_by") != std::string::npos);
}

namespace {

// Embedding, an MLP with a residual, and a vocabulary-parallel head and loss:
// whole layers over a tp group of one rank.
struct TpNet : torch::nn::Module {
  static constexpr int64_t kVocab = 16, kDim = 8;
  tp::VocabParallelEmbedding emb{nullptr};
  tp::ColumnParallelLinear up{nullptr}, head{nullptr};
  tp::RowParallelLinear down{nullptr};
  explicit TpNet(Communicator& tp) {
    emb = register_module("emb", tp::VocabParallelEmbedding(tp, tp::VocabParallelEmbeddingOptions(kVocab, kDim)));
    up = register_module("up", tp::ColumnParallelLinear(tp, tp::ParallelLinearOptions(kDim, 4 * kDim)));
    down = register_module("down", tp::RowParallelLinear(tp, tp::ParallelLinearOptions(4 * kDim, kDim)));
    head = register_module("head", tp::ColumnParallelLinear(tp, tp::ParallelLinearOptions(kDim, kVocab).bias(false)));
  }
};

constexpr int64_t kRows = 8, kTime = 6;

std::pair<torch::Tensor, torch::Tensor> tokens_of_step(int step) {
  torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(700 + static_cast<uint64_t>(step));
  const torch::Tensor seq = torch::randint(TpNet::kVocab, {kRows, kTime + 1}, gen);
  return {seq.narrow(1, 0, kTime), seq.narrow(1, 1, kTime)};
}

struct Trained {
  std::map<std::string, torch::Tensor> masters;  // by name, in the parameters' shapes
  std::vector<double> norms;                     // each step's gradient norm, before clipping
};

// Trains 3 AdamW steps, gradients clipped to norm 0.01 (below the norms
// seen, so every step clips), on this dp rank's rows.
Trained train_tp(Communicator& dp, Communicator& tp, int stage, const ModelParallel& mp = {}) {
  torch::set_num_threads(1);
  CachingAllocator alloc(make_host_allocator());
  EngineConfig c;
  c.zero.stage = stage;
  c.zero.stage3_param_persistence_threshold = 0;
  c.zero.reduce_bucket_size = 100;
  c.optimizer.kind = OptimizerKind::kAdamW;
  c.optimizer.lr = 0.01f;
  c.optimizer.weight_decay = 0.01f;
  c.gradient_clipping = 0.01f;
  Engine engine(c, dp, alloc, Stream::default_for(Device::host()));
  if (mp.group != nullptr) engine.set_model_parallel(mp);
  auto net = seeded(77, [&] { return std::make_shared<TpNet>(tp); });
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& item : net->named_parameters()) shapes[item.key()] = item.value().sizes().vec();
  TorchModule zt(engine, net);
  const int64_t rows = kRows / dp.size();
  Trained out;
  for (int s = 0; s < 3; ++s) {
    auto [x, y] = tokens_of_step(s);
    x = x.narrow(0, rows * dp.rank(), rows);
    y = y.narrow(0, rows * dp.rank(), rows);
    torch::Tensor h = zt.call(*net->emb, [&] { return net->emb(x); });
    const torch::Tensor u = zt.call(*net->up, [&] { return torch::gelu(net->up(h)); });
    h = h + zt.call(*net->down, [&] { return net->down(u); });
    const torch::Tensor logits = zt.call(*net->head, [&] { return net->head(h); });
    const torch::Tensor loss = tp::vocab_parallel_cross_entropy(logits, y, tp).mean();
    zt.scale(loss).backward();
    const StepResult r = zt.step();
    REQUIRE(r.applied);
    CHECK(r.clipped);
    out.norms.push_back(r.grad_norm);
  }
  for (const auto& [name, shape] : shapes)
    out.masters[name] = torch::tensor(engine.param_master(name)).reshape(shape);
  return out;
}

// Which dimension of each parameter tp splits (-1: replicated).
int64_t split_dim(const std::string& name) {
  if (name == "down.weight") return 1;
  if (name == "down.bias") return -1;
  return 0;
}

}  // namespace

TEST_CASE("dp x tp = 2 x 2 trains the one-rank model, clipped by the global norm, bit for bit across ZeRO stages") {
  Trained whole;
  run_inprocess(1, [&](Communicator& world) { whole = train_tp(world, world, 0); });
  std::vector<std::map<std::string, torch::Tensor>> stage0(4);  // by world rank
  for (const int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    run_inprocess(4, [&](Communicator& world) {
      // Megatron's order, tp fastest: tp groups {0, 1} and {2, 3}, dp groups
      // {0, 2} and {1, 3}.
      DeviceMesh mesh(world, {.dp = 2, .tp = 2, .pp = 1});
      const Trained mine = train_tp(mesh.dp(), mesh.tp(), stage, mesh.engine_model_parallel());
      // The norm over tp ranks counts the replicated down.bias once: the
      // whole model's norm, but for the split sums' rounding.
      for (size_t s = 0; s < whole.norms.size(); ++s) CHECK(mine.norms[s] == doctest::Approx(whole.norms[s]).epsilon(1e-6));
      REQUIRE(mine.masters.size() == whole.masters.size());
      for (const auto& [name, value] : mine.masters) {
        CAPTURE(name);
        const int64_t dim = split_dim(name);
        const torch::Tensor expect = dim < 0 ? whole.masters.at(name) : part(whole.masters.at(name), dim, mesh.tp_rank(), 2);
        CHECK(max_abs_diff(value, expect) < kTrained);
        if (stage == 0) {
          stage0[static_cast<size_t>(world.rank())][name] = value;
        } else {
          CHECK(same_bits(value, stage0[static_cast<size_t>(world.rank())].at(name)));
        }
        if (dim < 0) {  // replicated: the same bits on both tp ranks
          torch::Tensor g = value.clone();
          mesh.tp().all_reduce(g.data_ptr(), g.data_ptr(), static_cast<size_t>(g.numel()), DType::kFloat32,
                               ReduceOp::kMax, Stream::default_for(mesh.tp().device()));
          CHECK(same_bits(g, value));
        }
      }
    });
  }
}

TEST_CASE("partitioned_parameters names the split parameters, not the replicated ones, with their splits") {
  run_inprocess(2, [](Communicator& tp) {
    TpNet net(tp);
    const std::vector<std::string> names = tp::partitioned_parameters(net);
    CHECK(names == std::vector<std::string>{"emb.weight", "up.weight", "up.bias", "down.weight", "head.weight"});
    // What an export joins the slices by: partition()'s dim and stride.
    net.register_module("qkv", tp::ColumnParallelLinear(tp, tp::ParallelLinearOptions(TpNet::kDim, 12).stride(3)));
    std::map<std::string, std::pair<int, int>> splits;  // name -> (dim, stride), printable
    for (const auto& [name, split] : tp::partitioned_parameter_splits(net)) splits[name] = {split.dim, split.stride};
    CHECK(splits == std::map<std::string, std::pair<int, int>>{{"emb.weight", {0, 1}},
                                                               {"up.weight", {0, 1}},
                                                               {"up.bias", {0, 1}},
                                                               {"down.weight", {1, 1}},
                                                               {"head.weight", {0, 1}},
                                                               {"qkv.weight", {0, 3}},
                                                               {"qkv.bias", {0, 3}}});
  });
}

}  // namespace test_tensor_parallel
