// Fine-tuning semantics of the Llama example on tokenized data
// (common/token_data.h, data/packed_rows.h), against plain libtorch:
// - packed rows compute what the same documents compute one at a time
//   (positions restart, attention stays within a document);
// - the update follows the mean over the global batch's trained tokens,
//   whatever the ranks and micro-batches that split it, with the bits of
//   stage 0 at every stage; a mean of micro-batch means (the pre-2024
//   Hugging Face accumulation) would differ, and the test tells them apart.
//
// Tolerances: the packed row's attention sums over the whole row with the
// other documents' probabilities exactly 0 and its matrix products have
// another shape than a lone document's, so logits of magnitude ~1 differ by
// a few fp32 ulps: 1e-5 absolute. The gradient norms sum the same token
// gradients in another order (ranks, micro-batches): 1e-5 relative.
#include <cmath>
#include <cstdlib>
#include <map>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/temp_dir.h"
#include "common/default_config.h"
#include "common/mesh_trainer.h"
#include "common/token_data.h"
#include "llama_test_config.h"
#include "model.h"
#include "torch_doctest.h"
#include "trainer.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/data/tokenized_jsonl.h"
#include "zest/memory/raw_allocator.h"

namespace {

constexpr int64_t kRow = 64;

llama::Config sft_config() {
  llama::Config c = llama_test_config(false);
  c.max_position_embeddings = kRow;
  return c;
}

// Records of 5 to 94 tokens below 256, prompts masked: written by
// tests/tools/token_data_writer.py.
std::string write_records(const zest::test::TempDir& dir, int records) {
  const std::string path = dir / "sft.jsonl";
  const std::string command = fmt::format("python3 {}/tests/tools/token_data_writer.py jsonl {} --vocab 256 --records {}",
                                          ZEST_SOURCE_DIR, path, records);
  REQUIRE(std::system(command.c_str()) == 0);
  return path;
}

std::vector<std::vector<zest::RowPiece>> rows_of(const zest::RowPlan& plan, int64_t first, int64_t count) {
  std::vector<std::vector<zest::RowPiece>> out;
  for (int64_t r = first; r < first + count; ++r) out.emplace_back(plan.row(r).begin(), plan.row(r).end());
  return out;
}

double grad_norm(torch::nn::Module& m) {
  double sum = 0.0;
  for (const auto& p : m.parameters()) {
    if (p.grad().defined()) sum += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(sum);
}

}  // namespace

TEST_CASE("llama sft: a packed row computes what its documents compute one at a time") {
  zest::test::TempDir dir;
  const zest::TokenizedJsonl data(write_records(dir, 40), 256);
  const zest::RowPlan plan(data, 0, {.max_seq_len = kRow, .packing = true, .shuffle = false});
  llama::LlamaForCausalLM model(sft_config(), 7);
  const torch::NoGradGuard no_grad;
  int64_t documents = 0;
  for (int64_t r = 0; r < std::min<int64_t>(plan.rows(), 6); ++r) {
    CAPTURE(r);
    const examples::Batch packed = examples::to_batch(data, rows_of(plan, r, 1), kRow, true);
    model->set_packing(packed.positions, packed.documents);
    const torch::Tensor logits = model->forward(packed.inputs);
    model->set_packing({}, {});
    const torch::Tensor packed_sum = model->loss_sum(logits, packed.targets);
    double alone_sum = 0.0;
    int64_t at = 0;
    for (const zest::RowPiece& p : plan.row(r)) {
      const examples::Batch one = examples::to_batch(data, {{p}}, p.tokens, false);
      const torch::Tensor alone = model->forward(one.inputs);
      CHECK(torch::allclose(logits.narrow(1, at, p.tokens), alone, 0.0, 1e-5));
      alone_sum += model->loss_sum(alone, one.targets).item<double>();
      at += p.tokens;
      ++documents;
    }
    CHECK(packed_sum.item<double>() == doctest::Approx(alone_sum).epsilon(1e-5));
  }
  CHECK(documents > 6);  // rows of several documents
}

TEST_CASE("llama sft: the update is the global batch's trained-token mean, on any ranks and micro-batches") {
  zest::test::TempDir dir;
  const zest::TokenizedJsonl data(write_records(dir, 60), 256);
  // One document a row (rows of 5 to 64 tokens, prompts masked): the
  // micro-batches' trained tokens differ widely.
  const zest::RowPlan plan(data, 0, {.max_seq_len = kRow, .packing = false, .shuffle = false});
  constexpr int64_t kBatch = 8;
  REQUIRE(plan.rows() >= kBatch);
  const examples::Batch global = examples::to_batch(data, rows_of(plan, 0, kBatch), kRow, false);

  // Reference: plain libtorch, one forward of the global batch, the mean
  // over its trained tokens.
  double want = 0.0, means_of_means = 0.0;
  {
    llama::LlamaForCausalLM model(sft_config(), 7);
    const torch::Tensor logits = model->forward(global.inputs);
    const torch::Tensor trained = (global.targets != -100).sum();
    (model->loss_sum(logits, global.targets) / trained.to(torch::kFloat)).backward();
    want = grad_norm(*model);
    // Four micro-batches' mean losses averaged instead.
    model->zero_grad();
    const torch::Tensor again = model->forward(global.inputs);
    torch::Tensor loss = torch::zeros({});
    for (int64_t m = 0; m < 4; ++m) {
      loss = loss + model->loss(again.narrow(0, 2 * m, 2), global.targets.narrow(0, 2 * m, 2)) / 4.0;
    }
    loss.backward();
    means_of_means = grad_norm(*model);
  }
  CHECK(std::abs(means_of_means - want) / want > 1e-3);  // the two are told apart

  std::map<std::pair<int, int>, double> norms;  // (ranks, stage) -> |g|
  // The head and loss in chunks of 7 tokens (set_loss_chunk) on 2 x 2.
  for (const auto& [ranks, accum, chunk] : std::vector<std::tuple<int, int, int64_t>>{
           {1, 4, 0}, {2, 2, 0}, {4, 1, 0}, {2, 2, 7}}) {
    for (const int stage : {0, 3}) {
      CAPTURE(ranks);
      CAPTURE(stage);
      zest::EngineConfig config = examples::default_engine_config(1e-3f);
      config.zero.stage = stage;
      config.gradient_accumulation_steps = accum;
      std::vector<double> rank_norms(static_cast<size_t>(ranks));
      zest::run_inprocess(ranks, [&](zest::Communicator& comm) {
        zest::CachingAllocator alloc(zest::make_host_allocator());
        zest::Engine engine(config, comm, alloc, zest::Stream::default_for(comm.device()));
        llama::LlamaForCausalLM model(sft_config(), 7);
        const auto zt = llama::wrap(engine, model);
        model->set_loss_chunk(chunk);
        const int64_t rows = kBatch / ranks, per_micro = rows / accum;
        examples::MeshTrainer trainer(nullptr, *zt, *model, per_micro, kRow);
        std::vector<examples::Batch> micro;
        for (int64_t m = 0; m < accum; ++m) {
          micro.push_back(examples::to_batch(data, rows_of(plan, comm.rank() * rows + m * per_micro, per_micro), kRow,
                                             false));
        }
        const int64_t trained = examples::global_trained_tokens(engine, micro);
        const examples::MeshTrainer::Step s = trainer.train_step(micro, trained);
        rank_norms[static_cast<size_t>(comm.rank())] = s.result.grad_norm;
      });
      for (const double n : rank_norms) CHECK(n == rank_norms[0]);
      CAPTURE(chunk);
      CHECK(rank_norms[0] == doctest::Approx(want).epsilon(1e-5));
      norms[{ranks * 100 + static_cast<int>(chunk), stage}] = rank_norms[0];
    }
    // Every stage has stage 0's bits.
    CHECK(norms[{ranks * 100 + static_cast<int>(chunk), 3}] == norms[{ranks * 100 + static_cast<int>(chunk), 0}]);
  }
}
