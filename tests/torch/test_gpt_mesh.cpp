// The GPT example over a device mesh (examples/gpt/mesh_trainer.h): dp x tp
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
#include <stdexcept>
#include <optional>

#include <fmt/format.h>
#include <unistd.h>

#include "common/corpus.h"
#include "gpt_test_text.h"
#include "mesh_trainer.h"
#include "model.h"
#include "torch_doctest.h"
#include "trainer.h"
#include "zest/checkpoint/safetensors.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/core/file_io.h"
#include "zest/memory/raw_allocator.h"
#include "zest/mesh/device_mesh.h"

namespace {

gpt::Config tiny(bool tied) {
  gpt::Config c;
  c.context = 16;
  c.layers = 2;
  c.heads = 2;
  c.d_model = 32;
  c.tied_head = tied;
  return c;
}

constexpr int64_t kRows = 8;  // global batch
constexpr int kMicroBatches = 2;
constexpr int kSteps = 3;
constexpr uint64_t kSeed = 7;

zest::EngineConfig config(int stage) {
  zest::EngineConfig c;
  c.zero.stage = stage;
  c.zero.stage3_param_persistence_threshold = 0;  // every unit sharded
  c.zero.reduce_bucket_size = 3000;               // several buckets
  c.optimizer.lr = 1e-2f;
  c.optimizer.beta2 = 0.95f;
  c.optimizer.eps = 1e-6f;  // see the top of this file
  c.gradient_clipping = 0.05;  // below the norms seen: every step clips
  c.gradient_accumulation_steps = kMicroBatches;
  return c;
}

struct Run {
  std::vector<float> losses;  // per step, this dp rank's
  std::vector<double> norms;
  double val_loss = 0.0;
  std::map<std::string, torch::Tensor> masters;  // this rank's part, in the parameters' shapes
  std::string sample;
  int tp_rank = 0, tp_size = 1;  // the part of each parameter it holds
};

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

void export_weights(zest::TorchModule& zt, const std::string& dir, const std::string& when) {
  zt.export_safetensors(dir + "/" + when + ".safetensors");
  zest::HfExportOptions o;
  o.config_json = R"({"model_type": "gpt2"})";
  o.dtype = zest::DType::kFloat32;
  o.max_shard_size = 40000;
  zt.export_hf(dir + "/" + when + "_hf", o);
}

// Every rank's run on `shape` (a mesh; none for the plain one-rank path).
std::vector<Run> train(std::optional<zest::MeshShape> shape, int stage, bool tied,
                       zest::PipelineKind schedule = zest::PipelineKind::k1F1B, const Span& span = {}) {
  const examples::Corpus corpus = examples::Corpus::from_text(gpt_test_text());
  const int world = shape ? shape->world() : 1;
  std::vector<Run> runs(static_cast<size_t>(world));
  zest::run_inprocess(world, [&](zest::Communicator& comm) {
    torch::set_num_threads(1);
    std::optional<zest::DeviceMesh> mesh;
    if (shape) mesh.emplace(comm, *shape);
    zest::Communicator& dp = mesh ? mesh->dp() : comm;
    zest::CachingAllocator alloc(zest::make_host_allocator());
    zest::Engine engine(config(stage), dp, alloc, zest::Stream::default_for(comm.device()));
    if (mesh) engine.set_model_parallel(mesh->engine_model_parallel());
    gpt::Gpt model(tiny(tied), kSeed, gpt::placement_of(mesh ? &*mesh : nullptr));
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& item : model->named_parameters()) shapes[item.key()] = item.value().sizes().vec();
    const auto zt = gpt::wrap(engine, model);
    if (!span.load.empty()) zt->load(span.load);
    const int64_t rows = kRows / dp.size() / kMicroBatches;
    gpt::MeshTrainer trainer(mesh ? &*mesh : nullptr, *zt, *model, rows, schedule);
    if (!span.export_dir.empty()) export_weights(*zt, span.export_dir, "before");
    Run& r = runs[static_cast<size_t>(comm.rank())];
    r.tp_rank = model->placement().tp_rank();
    r.tp_size = model->placement().tp_size();
    for (int s = span.first; s < span.last; ++s) {
      std::vector<examples::Batch> micro;
      for (int m = 0; m < kMicroBatches; ++m)
        micro.push_back(corpus.train_batch(s, dp.rank() * rows * kMicroBatches + m * rows, rows, 16, kSeed));
      const gpt::MeshTrainer::Step step = trainer.train_step(micro);
      REQUIRE(step.result.applied);
      CHECK(step.result.clipped);
      r.losses.push_back(step.loss);
      r.norms.push_back(step.result.grad_norm);
    }
    if (!span.save.empty()) zt->save(span.save);
    if (!span.export_dir.empty()) export_weights(*zt, span.export_dir, "after");
    r.val_loss = trainer.validation_loss(corpus, 2);
    r.sample = trainer.generate("Look ", {.length = 12, .temperature = 0.0});
    for (const auto& [name, sizes] : shapes)
      r.masters[name] = torch::tensor(engine.param_master(name)).reshape(sizes);
  });
  return runs;
}

// The message of the std::invalid_argument fn throws.
template <typename Fn>
std::string invalid_argument_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

// Each rank of a mesh run against the one-rank run: its part of every
// parameter, its dp rank's losses (the one-rank run's rows of that rank are
// a different mean, so losses are compared for dp = 1 only), the norms, the
// validation loss and the sample.
void check_against_whole(const std::vector<Run>& mesh, const Run& whole, int dp) {
  for (size_t rank = 0; rank < mesh.size(); ++rank) {
    CAPTURE(rank);
    const Run& r = mesh[rank];
    for (int s = 0; s < kSteps; ++s) {
      CHECK(relative(r.norms[static_cast<size_t>(s)], whole.norms[static_cast<size_t>(s)]) < 1e-5);
      if (dp == 1) CHECK(relative(r.losses[static_cast<size_t>(s)], whole.losses[static_cast<size_t>(s)]) < 1e-5);
    }
    CHECK(relative(r.val_loss, whole.val_loss) < 1e-5);
    CHECK(r.sample == whole.sample);
    for (const auto& [name, value] : r.masters) {
      CAPTURE(name);
      const torch::Tensor expect = gpt::part_of_whole(name, whole.masters.at(name), r.tp_rank, r.tp_size);
      REQUIRE(value.sizes() == expect.sizes());
      CHECK((value - expect).abs().max().item<double>() < 1e-5);
    }
  }
}

// Every rank of `b` holds the bits of the same rank of `a`.
void check_same_bits(const std::vector<Run>& a, const std::vector<Run>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t rank = 0; rank < a.size(); ++rank) {
    CAPTURE(rank);
    CHECK(a[rank].losses == b[rank].losses);
    CHECK(a[rank].norms == b[rank].norms);
    CHECK(a[rank].val_loss == b[rank].val_loss);
    for (const auto& [name, value] : a[rank].masters) {
      CAPTURE(name);
      CHECK(torch::equal(value, b[rank].masters.at(name)));
    }
  }
}

}  // namespace

TEST_CASE("gpt over a mesh: dp x tp x pp in {1,2}^3 trains the one-rank model, bit for bit across ZeRO stages") {
  const Run whole = train(std::nullopt, 0, /*tied=*/true).at(0);
  CHECK(whole.losses.back() < whole.losses.front());
  for (const int dp : {1, 2}) {
    for (const int tp : {1, 2}) {
      for (const int pp : {1, 2}) {
        const zest::MeshShape shape{.dp = dp, .tp = tp, .pp = pp};
        CAPTURE(shape.str());
        const std::vector<Run> stage0 = train(shape, 0, true);
        check_against_whole(stage0, whole, dp);
        for (const int stage : {1, 2, 3}) {
          CAPTURE(stage);
          check_same_bits(stage0, train(shape, stage, true));
        }
      }
    }
  }
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

TEST_CASE("gpt placement: each part starts from the whole model's values, and bad sizes are named") {
  zest::run_inprocess(2, [](zest::Communicator& comm) {
    torch::set_num_threads(1);
    const gpt::Config c = tiny(true);
    gpt::Gpt whole(c, kSeed);
    // Stage 1 of 2, tp rank comm.rank() of 2: the second block and ln_f.
    gpt::Gpt part(c, kSeed, gpt::Placement{.tp = &comm, .stage = 1, .stages = 2});
    std::map<std::string, torch::Tensor> expect;
    for (const auto& item : whole->named_parameters()) expect[item.key()] = item.value();
    std::vector<std::string> names;
    for (const auto& item : part->named_parameters()) {
      names.push_back(item.key());
      CHECK(torch::equal(item.value(), gpt::part_of_whole(item.key(), expect.at(item.key()), comm.rank(), 2)));
    }
    CHECK(names.front() == "h.1.ln_1.weight");
    CHECK(names.back() == "ln_f.bias");
    // c_attn keeps this rank's head of q, k and v: rows [16 r, 16 r + 16) of each third.
    const torch::Tensor qkv = part->named_parameters()["h.1.attn.c_attn.weight"];
    const torch::Tensor w = expect.at("h.1.attn.c_attn.weight");
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

namespace {

std::string file_bytes(const std::filesystem::path& path) { return zest::read_text_file(path.string()); }

// Every file of a directory, by name.
std::map<std::string, std::string> dir_bytes(const std::filesystem::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out[e.path().filename().string()] = file_bytes(e);
  return out;
}

// The same tensors (names, shapes, dtypes, in order), their values within
// the tolerance at the top of this file.
void check_close_files(const std::filesystem::path& a, const std::filesystem::path& b) {
  CAPTURE(a.filename().string());
  const zest::SafetensorsFile fa = zest::SafetensorsFile::open(a.string());
  const zest::SafetensorsFile fb = zest::SafetensorsFile::open(b.string());
  REQUIRE(fa.tensors().size() == fb.tensors().size());
  for (size_t i = 0; i < fa.tensors().size(); ++i) {
    const zest::SafetensorsTensor& ta = fa.tensors()[i];
    const zest::SafetensorsTensor& tb = fb.tensors()[i];
    CAPTURE(ta.name);
    REQUIRE(ta.name == tb.name);
    REQUIRE(ta.shape == tb.shape);
    REQUIRE(ta.dtype == tb.dtype);
    int64_t n = 1;
    for (const int64_t d : ta.shape) n *= d;
    std::vector<float> va(static_cast<size_t>(n)), vb(static_cast<size_t>(n));
    fa.read_as(ta.name, zest::DType::kFloat32, std::as_writable_bytes(std::span(va)));
    fb.read_as(tb.name, zest::DType::kFloat32, std::as_writable_bytes(std::span(vb)));
    double worst = 0.0;
    for (size_t k = 0; k < va.size(); ++k) worst = std::max(worst, std::abs(double(va[k]) - vb[k]));
    CHECK(worst < 1e-5);
  }
}

}  // namespace

TEST_CASE("gpt over a mesh: dp x tp x pp = 2 x 2 x 2 exports the one-rank model's files") {
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
    check_close_files(one / "after.safetensors", mesh / "after.safetensors");
    const std::map<std::string, std::string> after = dir_bytes(one / "after_hf");
    const std::map<std::string, std::string> mesh_after = dir_bytes(mesh / "after_hf");
    REQUIRE(after.size() == mesh_after.size());
    for (const auto& [name, bytes] : after) {
      REQUIRE(mesh_after.count(name) == 1);
      if (name.ends_with(".safetensors")) {
        check_close_files(one / "after_hf" / name, mesh / "after_hf" / name);
      } else {
        CHECK(mesh_after.at(name) == bytes);  // config.json, the index
      }
    }
    fs::remove_all(root);
  }
}
