// The GPT example over a device mesh (examples/common/mesh_trainer.h): dp x tp
// x pp in {1,2}^3 on in-process ranks against the whole model on one rank
// through the example's plain path, and bit for bit across ZeRO stages 0-3
// within each mesh. A run is 3 AdamW steps of 2 micro-batches (the
// pipeline's), clipped by the global gradient norm, then the validation
// loss and a greedy sample.
//
// Tolerances: a mesh computes the one-rank model's arithmetic with some sums
// split: row-parallel products and the vocabulary's softmax in two halves
// (tp), the tied embedding's two gradients added once per batch instead of
// once per micro-batch (pp), the norm's squares summed per group. Each split
// moves a result by a few fp32 ulps of O(1) values; AdamW's updates of lr
// 1e-2 carry that relative difference into the weights: 1e-5 on weights
// after 3 steps (test_tensor_parallel.cpp's bound), 1e-5 relative on losses
// and norms. Adam's update lr g / (|g| + eps) is steepest where a gradient
// nearly cancels (|g| ~ eps), d update / d g = lr eps / (|g| + eps)^2: with
// torch's eps 1e-8 an absolute rounding of 1e-10 in such a sum moves the
// weight by 2.5e-5 (seen: 8e-5), a property of the optimizer, not of the
// split. eps 1e-6 keeps that below 1e-6, so the bound tests the split. The
// greedy sample must be the same text: no two logits of the trained model
// are that close.
#include <filesystem>
#include <map>
#include <optional>
#include <span>

#include <fmt/format.h>
#include <unistd.h>

#include "gpt_test_text.h"
#include "mesh_run.h"
#include "model.h"
#include "sample.h"
#include "torch_doctest.h"
#include "trainer.h"
#include "zest/checkpoint/safetensors.h"
#include "zest/comm/inprocess_comm.h"

namespace test_gpt_mesh {

namespace {

using namespace mesh_run;

gpt::Config tiny(bool tied) {
  gpt::Config c;
  c.context = kContext;
  c.layers = 2;
  c.heads = 2;
  c.d_model = 32;
  c.tied_head = tied;
  return c;
}

constexpr uint64_t kSeed = 7;

// Steps [first, last), loading a checkpoint from `load` before and saving
// one to `save` after, when given. With `export_dir`, the weights are
// exported into it before the first step and after the last: before and
// after.safetensors (fp32), before_hf and after_hf (Hugging Face, fp32, in
// several shards).
struct Span {
  int first = 0;
  int last = kSteps;
  std::string load, save;
  std::string export_dir{};
};

// The GPT of `placement`, its parameters drawn from `model_seed`, with
// adapters of rank lora_r (the base frozen) when lora_r > 0, and its wrap.
Options model_options(bool tied, int64_t lora_r, uint64_t model_seed) {
  Options o;
  o.build = [tied, lora_r, model_seed](const examples::Placement& placement) {
    gpt::Gpt model(tiny(tied), model_seed, placement);
    if (lora_r > 0) {
      zest::LoraOptions lora;
      lora.r = lora_r;
      lora.alpha = 16;
      zest::enable_lora(*model, gpt::lora_targets(), lora, model_seed);
    }
    return Model{model.ptr(), model.get()};
  };
  o.wrap = [](zest::Engine& engine, const Model& m) {
    return gpt::wrap(engine, gpt::Gpt(std::dynamic_pointer_cast<gpt::GptImpl>(m.module)));
  };
  return o;
}

// Every rank's run on `shape` (a mesh; none for the plain one-rank path),
// with a greedy sample of 12 bytes after "Look ".
std::vector<Run> train(std::optional<zest::MeshShape> shape, int stage, bool tied,
                       zest::PipelineKind schedule = zest::PipelineKind::k1F1B, const Span& span = {},
                       int64_t lora_r = 0) {
  Options o = model_options(tied, lora_r, kSeed);
  o.seed = kSeed;
  o.schedule = schedule;
  o.first = span.first;
  o.last = span.last;
  o.load = span.load;
  o.save = span.save;
  if (!span.export_dir.empty()) {
    o.on_weights = [dir = span.export_dir](zest::TorchModule& zt, const char* when) {
      zt.export_safetensors(fmt::format("{}/{}.safetensors", dir, when));
      zest::HfExportOptions e;
      e.config_json = R"({"model_type": "gpt2"})";
      e.dtype = zest::DType::kFloat32;
      e.max_shard_size = 40000;
      zt.export_hf(fmt::format("{}/{}_hf", dir, when), e);
    };
  }
  o.sample = [](examples::MeshTrainer& trainer) {
    return gpt::generate([&](const torch::Tensor& tokens) { return trainer.last_logits(tokens); }, kContext, "Look ",
                         {.length = 12, .temperature = 0.0});
  };
  return mesh_run::train(gpt_test_text(), shape, stage, /*bucket=*/3000, o);
}

void check_against_whole(const std::vector<Run>& mesh, const Run& whole, int dp) {
  mesh_run::check_against_whole(mesh, whole, dp, gpt::part_of_whole);
}

}  // namespace

TEST_CASE("gpt over a mesh: dp x tp x pp in {1,2}^3 trains the one-rank model, bit for bit across ZeRO stages") {
  const Run whole = train(std::nullopt, 0, /*tied=*/true).at(0);
  CHECK(whole.losses.back() < whole.losses.front());
  check_every_mesh(whole, [](const zest::MeshShape& shape, int stage) { return train(shape, stage, true); },
                   gpt::part_of_whole);
}

TEST_CASE("gpt over a mesh: an untied head split by vocabulary, and GPipe with 1F1B's bits for a tied head") {
  const Run untied = train(std::nullopt, 0, /*tied=*/false).at(0);
  const std::vector<Run> mesh = train(zest::MeshShape{.dp = 1, .tp = 2, .pp = 2}, 3, false);
  check_against_whole(mesh, untied, 1);
  CHECK(mesh[0].masters.count("lm_head.weight") == 0);  // on the last stage
  CHECK(mesh[3].masters.at("lm_head.weight").size(0) == 128);  // half the vocabulary

  // GPipe runs its backwards in micro-batch order too, so the tied
  // gradient joins the same micro-step: the bits of 1F1B.
  const zest::MeshShape shape{.dp = 2, .tp = 1, .pp = 2};
  check_same_bits(train(shape, 2, true, zest::PipelineKind::kGPipe), train(shape, 2, true));
}

TEST_CASE("gpt over a mesh: LoRA on the split layers (c_attn's stride 3 too) trains the one-rank adapters") {
  const Run one = train(std::nullopt, 0, true, zest::PipelineKind::k1F1B, {}, /*lora_r=*/4).at(0);
  CHECK(one.losses.back() < one.losses.front());
  const zest::MeshShape shape{.dp = 2, .tp = 2, .pp = 2};
  const std::vector<Run> stage0 = train(shape, 0, true, zest::PipelineKind::k1F1B, {}, 4);
  check_against_whole(stage0, one, 2);
  // c_attn's B: this rank's rows of q, k and v (3 x 16 of 3 x 32).
  CHECK(stage0[0].masters.at("h.0.attn.c_attn.lora_B.weight").sizes() == torch::IntArrayRef{48, 4});
  check_same_bits(stage0, train(shape, 3, true, zest::PipelineKind::k1F1B, {}, 4));
}

TEST_CASE("gpt placement: each part starts from the whole model's values, and bad sizes are named") {
  zest::run_inprocess(2, [](zest::Communicator& comm) {
    torch::set_num_threads(1);
    const gpt::Config c = tiny(true);
    gpt::Gpt whole(c, kSeed);
    // Stage 1 of 2, tp rank comm.rank() of 2: the second block and ln_f.
    gpt::Gpt part(c, kSeed, gpt::Placement{.tp = &comm, .stage = 1, .stages = 2});
    const std::vector<std::string> names = check_parts_of(*whole, *part, comm.rank(), 2, gpt::part_of_whole);
    CHECK(names.front() == "h.1.ln_1.weight");
    CHECK(names.back() == "ln_f.bias");
    // c_attn keeps this rank's head of q, k and v: rows [16 r, 16 r + 16) of each third.
    const torch::Tensor qkv = part->named_parameters()["h.1.attn.c_attn.weight"];
    const torch::Tensor w = whole->named_parameters()["h.1.attn.c_attn.weight"];
    for (int64_t third = 0; third < 3; ++third)
      CHECK(torch::equal(qkv.narrow(0, 16 * third, 16), w.narrow(0, 32 * third + 16 * comm.rank(), 16)));
    gpt::Config odd = c;
    odd.heads = 1;
    odd.d_model = 32;
    const std::string e = invalid_argument_of([&] { gpt::Gpt bad(odd, kSeed, gpt::Placement{.tp = &comm}); });
    CHECK(e.find("splits the 1 heads") != std::string::npos);
  });
  const std::string e = invalid_argument_of([] { gpt::Gpt bad(tiny(true), kSeed, gpt::Placement{.stage = 0, .stages = 3}); });
  CHECK(e.find("3 pipeline stages for 2 layers") != std::string::npos);
}

TEST_CASE("gpt over a mesh: a checkpoint per part, resumed on the same mesh and on another data-parallel size") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / fmt::format("zest_test_gpt_mesh_{}", ::getpid());
  fs::remove_all(root);
  const zest::MeshShape mesh{.dp = 2, .tp = 2, .pp = 2};
  const std::vector<Run> whole = train(mesh, 3, true);
  train(mesh, 3, true, zest::PipelineKind::k1F1B, {.first = 0, .last = 2, .load = {}, .save = root.string()});
  for (const char* part : {"mp_rank_00_000", "mp_rank_01_000", "mp_rank_00_001", "mp_rank_01_001"})
    CHECK(fs::exists(root / part / "latest"));
  // The same mesh goes on with the bits of the uninterrupted run.
  const std::vector<Run> resumed =
      train(mesh, 3, true, zest::PipelineKind::k1F1B, {.first = 2, .last = 3, .load = root.string(), .save = {}});
  for (size_t rank = 0; rank < whole.size(); ++rank) {
    CAPTURE(rank);
    CHECK(resumed[rank].losses.back() == whole[rank].losses.back());
    for (const auto& [name, value] : whole[rank].masters) CHECK(torch::equal(value, resumed[rank].masters.at(name)));
  }
  // Half the replicas (each part resharded from 2 shards to 1) and stage 1:
  // the step after the load sees a batch split otherwise, so against the
  // whole run within the tolerance above.
  const std::vector<Run> fewer = train(zest::MeshShape{.dp = 1, .tp = 2, .pp = 2}, 1, true, zest::PipelineKind::k1F1B,
                                       {.first = 2, .last = 3, .load = root.string(), .save = {}});
  for (size_t rank = 0; rank < fewer.size(); ++rank) {
    // dp 1's rank r is the mesh's tp r % 2, pp r / 2: rank 2 r % 4 + r / 2 of dp 2's (dp rank 0).
    const Run& same = whole[static_cast<size_t>((rank % 2) + 4 * (rank / 2))];
    for (const auto& [name, value] : same.masters) {
      CAPTURE(name);
      CHECK((value - fewer[rank].masters.at(name)).abs().max().item<double>() < 1e-5);
    }
  }
  // Another tp or pp size is named.
  CHECK_THROWS_WITH(train(zest::MeshShape{.dp = 2, .tp = 1, .pp = 2}, 3, true, zest::PipelineKind::k1F1B,
                          {.first = 2, .last = 3, .load = root.string(), .save = {}}),
                    doctest::Contains("saved on a mesh of tp 2 x pp 2, and this run has tp 1 x pp 2"));
  fs::remove_all(root);
}

TEST_CASE("gpt over a mesh: dp x tp x pp = 2 x 2 x 2 exports the one-rank model's files, and a mesh reads them back") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / fmt::format("zest_test_gpt_mesh_export_{}", ::getpid());
  fs::remove_all(root);
  for (const bool tied : {true, false}) {
    CAPTURE(tied);
    const fs::path one = root / "one", mesh = root / "mesh";
    fs::create_directories(one);
    fs::create_directories(mesh);
    // Two steps each; the mesh at stage 3, every unit gathered from shards.
    train(std::nullopt, 0, tied, zest::PipelineKind::k1F1B, {.first = 0, .last = 2, .load = {}, .save = {},
                                                             .export_dir = one.string()});
    train(zest::MeshShape{.dp = 2, .tp = 2, .pp = 2}, 3, tied, zest::PipelineKind::k1F1B,
          {.first = 0, .last = 2, .load = {}, .save = {}, .export_dir = mesh.string()});
    // Before training the values are the initial ones, exactly: the same bytes.
    CHECK(file_bytes(one / "before.safetensors") == file_bytes(mesh / "before.safetensors"));
    const std::map<std::string, std::string> hf = dir_bytes(one / "before_hf");
    CHECK(hf.count("model.safetensors.index.json") == 1);
    CHECK(dir_bytes(mesh / "before_hf") == hf);
    // After two steps, within the training's tolerance (top of this file).
    check_close_files(one / "after.safetensors", mesh / "after.safetensors", 1e-5);
    check_close_hf_dirs(one / "after_hf", mesh / "after_hf", 1e-5);
    // The one-rank directory read back into a mesh: c_attn's slices of
    // stride 3 (each tp rank's heads of q, k and v) from the whole tensor.
    const zest::MeshShape shape{.dp = 1, .tp = 2, .pp = 2};
    const std::vector<Run> imported =
        import_on_mesh((one / "after_hf").string(), shape, 3000, model_options(tied, 0, kSeed + 1));
    const zest::SafetensorsFile whole = zest::SafetensorsFile::open((one / "after.safetensors").string());
    for (const Run& r : imported) {
      for (const auto& [name, value] : r.masters) {
        CAPTURE(name);
        const zest::SafetensorsTensor& t = whole.tensor(name);
        int64_t n = 1;
        for (const int64_t d : t.shape) n *= d;
        std::vector<float> all(static_cast<size_t>(n));
        whole.read_as(name, zest::DType::kFloat32, std::as_writable_bytes(std::span(all)));
        const torch::Tensor w = torch::tensor(all).reshape(t.shape);
        CHECK(torch::equal(value, gpt::part_of_whole(name, w, r.tp_rank, r.tp_size)));
      }
    }
    fs::remove_all(root);
  }
}

}  // namespace test_gpt_mesh
