// The Llama example over a device mesh (examples/common/mesh_trainer.h):
// dp x tp x pp in {1,2}^3 on in-process ranks against the whole model on
// one rank, and bit for bit across ZeRO stages 0-3 within each mesh;
// grouped-query attention split by key-value heads; a head tied across the
// stages; activation recomputation on a mesh; the whole model exported from
// a mesh. A run is 3 AdamW steps of 2 micro-batches (the pipeline's),
// clipped by the global gradient norm, then the validation loss and the
// next token's logits.
//
// Tolerances, as test_gpt_mesh.cpp argues: a mesh computes the one-rank
// model's arithmetic with some sums split (the row-parallel o_proj and
// down_proj, the vocabulary's softmax, a tied head's two gradients, the
// norm's squares per group), each a few fp32 ulps of O(1) values, carried
// into the weights by AdamW at lr 1e-2 over 3 steps: 1e-5 absolute on
// weights and on logits, 1e-5 relative on losses and norms, with eps 1e-6
// so that a gradient that nearly cancels does not amplify a rounding (Adam's
// d update / d g = lr eps / (|g| + eps)^2).
#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>

#include "gpt_test_text.h"
#include "llama_test_config.h"
#include "mesh_run.h"
#include "model.h"
#include "torch_doctest.h"
#include "trainer.h"
#include "zest/comm/inprocess_comm.h"

namespace test_llama_mesh {

namespace {

using namespace mesh_run;

llama::Config tiny(bool tied, const std::string& family = "llama") {
  llama::Config c = llama_test_config(tied);
  c.model_type = family;
  return c;
}

constexpr uint64_t kSeed = 5;

struct RunOptions {
  bool tied = false;
  std::string family = "llama";  // qwen2: q, k and v biases; qwen3: q_norm and k_norm
  int64_t lora_r = 0;  // adapters of this rank on every projection, the base frozen
  bool recompute = false;
  zest::PipelineKind schedule = zest::PipelineKind::k1F1B;
  std::string export_dir{};  // before and after training: before_hf, after_hf (fp32, several shards)
};

// The Llama of `placement`, its parameters drawn from `model_seed`, with
// adapters of rank lora_r (the base frozen) when lora_r > 0, and its wrap.
Options model_options(bool tied, int64_t lora_r, uint64_t model_seed, const std::string& family = "llama") {
  Options o;
  o.build = [tied, lora_r, model_seed, family](const examples::Placement& placement) {
    llama::LlamaForCausalLM model(tiny(tied, family), model_seed, placement);
    if (lora_r > 0) {
      zest::LoraOptions lora;
      lora.r = lora_r;
      lora.alpha = 16;
      llama::enable_lora(*model, lora, model_seed);
    }
    return Model{model.ptr(), model.get()};
  };
  o.wrap = [](zest::Engine& engine, const Model& m) {
    return llama::wrap(engine, llama::LlamaForCausalLM(std::dynamic_pointer_cast<llama::LlamaForCausalLMImpl>(m.module)));
  };
  return o;
}

// Every rank's run on `shape` (a mesh; none for the plain one-rank path).
std::vector<Run> train(std::optional<zest::MeshShape> shape, int stage, const RunOptions& opt = {}) {
  Options o = model_options(opt.tied, opt.lora_r, kSeed, opt.family);
  if (opt.recompute) {
    o.after_wrap = [](zest::TorchModule& zt, Model& m) {
      std::dynamic_pointer_cast<llama::LlamaForCausalLMImpl>(m.module)->set_layer_runner(llama::checkpointing(zt));
    };
  }
  o.seed = kSeed;
  o.schedule = opt.schedule;
  if (!opt.export_dir.empty()) {
    o.on_weights = [dir = opt.export_dir](zest::TorchModule& zt, const char* when) {
      zest::HfExportOptions e;
      e.config_json = tiny(false).to_json();
      e.dtype = zest::DType::kFloat32;
      e.max_shard_size = 20000;
      zt.export_hf(fmt::format("{}/{}_hf", dir, when), e);
    };
  }
  return mesh_run::train(gpt_test_text(), shape, stage, /*bucket=*/2000, o);
}

void check_against_whole(const std::vector<Run>& mesh, const Run& whole, int dp) {
  mesh_run::check_against_whole(mesh, whole, dp, llama::part_of_whole);
}

}  // namespace

TEST_CASE("llama over a mesh: dp x tp x pp in {1,2}^3 trains the one-rank model, bit for bit across ZeRO stages") {
  const Run whole = train(std::nullopt, 0).at(0);
  CHECK(whole.losses.back() < whole.losses.front());
  check_every_mesh(whole, [](const zest::MeshShape& shape, int stage) { return train(shape, stage); },
                   llama::part_of_whole);
}

TEST_CASE("qwen2 and qwen3 over a mesh: dp x tp x pp = 2 x 2 x 2 trains the one-rank model, bit for bit across stages") {
  // qwen2's q, k and v biases split with their rows; qwen3's q_norm and
  // k_norm whole on each tp rank, their gradients (each rank's heads' part)
  // summed over tp: without that sum the two ranks' norms would drift apart
  // and from the one-rank model's.
  for (const char* family : {"qwen2", "qwen3"}) {
    CAPTURE(family);
    const Run whole = train(std::nullopt, 0, {.family = family}).at(0);
    CHECK(whole.losses.back() < whole.losses.front());
    const zest::MeshShape shape{.dp = 2, .tp = 2, .pp = 2};
    const std::vector<Run> mesh = train(shape, 1, {.family = family});
    check_against_whole(mesh, whole, 2);
    check_same_bits(mesh, train(shape, 3, {.family = family}));
    const std::string norm = "model.layers.0.self_attn.q_norm.weight";
    if (std::string(family) == "qwen3") {
      REQUIRE(whole.masters.count(norm) == 1);
      CHECK_FALSE(torch::equal(whole.masters.at(norm), torch::ones({6})));  // it trained
    }
  }
}

TEST_CASE("llama over a mesh: a head tied across the stages, GPipe, and recomputed layers keep the bits") {
  const Run tied = train(std::nullopt, 0, {.tied = true}).at(0);
  const zest::MeshShape shape{.dp = 1, .tp = 2, .pp = 2};
  const std::vector<Run> mesh = train(shape, 3, {.tied = true});
  check_against_whole(mesh, tied, 1);
  CHECK(mesh[0].masters.count("model.embed_tokens.weight") == 1);  // on the first stage, half the vocabulary
  CHECK(mesh[0].masters.at("model.embed_tokens.weight").size(0) == 130);
  CHECK(mesh[3].masters.count("model.embed_tokens.weight") == 0);  // the last stage's copy is no parameter
  CHECK(mesh[3].masters.count("lm_head.weight") == 0);
  check_same_bits(mesh, train(shape, 3, {.tied = true, .recompute = true}));
  check_same_bits(mesh, train(shape, 3, {.tied = true, .schedule = zest::PipelineKind::kGPipe}));
}

TEST_CASE("llama placement: each part starts from the whole model's values, kv heads with their queries") {
  zest::run_inprocess(2, [](zest::Communicator& comm) {
    torch::set_num_threads(1);
    const llama::Config c = tiny(false);
    llama::LlamaForCausalLM whole(c, kSeed);
    // Stage 1 of 2, tp rank comm.rank() of 2: the second layer, the norm, the head.
    llama::LlamaForCausalLM part(c, kSeed, llama::Placement{.tp = &comm, .stage = 1, .stages = 2});
    const std::vector<std::string> names = check_parts_of(*whole, *part, comm.rank(), 2, llama::part_of_whole);
    CHECK(names.front() == "model.layers.1.input_layernorm.weight");
    CHECK(names.back() == "lm_head.weight");
    // Query heads 2r and 2r + 1 (rows [12 r, 12 r + 12) of q_proj) and the kv
    // head they read, r (rows [6 r, 6 r + 6) of k_proj and v_proj).
    const auto params = part->named_parameters();
    const auto expect = whole->named_parameters();
    const std::string l = "model.layers.1.self_attn.";
    CHECK(torch::equal(params[l + "q_proj.weight"], expect[l + "q_proj.weight"].narrow(0, 12 * comm.rank(), 12)));
    CHECK(torch::equal(params[l + "k_proj.weight"], expect[l + "k_proj.weight"].narrow(0, 6 * comm.rank(), 6)));
    CHECK(torch::equal(params[l + "o_proj.weight"], expect[l + "o_proj.weight"].narrow(1, 12 * comm.rank(), 12)));
    llama::Config one_kv = c;
    one_kv.num_key_value_heads = 1;
    const std::string e =
        invalid_argument_of([&] { llama::LlamaForCausalLM bad(one_kv, kSeed, llama::Placement{.tp = &comm}); });
    CHECK(e.find("the 1 key-value heads") != std::string::npos);
  });
  const std::string e = invalid_argument_of(
      [] { llama::LlamaForCausalLM bad(tiny(false), kSeed, llama::Placement{.stage = 0, .stages = 3}); });
  CHECK(e.find("3 pipeline stages for 2 layers") != std::string::npos);
}

TEST_CASE("llama over a mesh: dp x tp x pp = 2 x 2 x 2 exports the one-rank model's Hugging Face directory") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / fmt::format("zest_test_llama_mesh_export_{}", ::getpid());
  for (const bool tied : {false, true}) {
    CAPTURE(tied);
    fs::remove_all(root);
    const fs::path one = root / "one", mesh = root / "mesh";
    fs::create_directories(one);
    fs::create_directories(mesh);
    train(std::nullopt, 0, {.tied = tied, .export_dir = one.string()});
    train(zest::MeshShape{.dp = 2, .tp = 2, .pp = 2}, 3, {.tied = tied, .export_dir = mesh.string()});
    // The initial values exactly: the same bytes, in more than one shard.
    const std::map<std::string, std::string> before = dir_bytes(one / "before_hf");
    CHECK(before.count("model.safetensors.index.json") == 1);
    CHECK(std::count_if(before.begin(), before.end(), [](const auto& f) { return f.first.ends_with(".safetensors"); }) > 1);
    CHECK(dir_bytes(mesh / "before_hf") == before);
    // After training, within the tolerance at the top of this file.
    check_close_hf_dirs(one / "after_hf", mesh / "after_hf", 1e-5);
  }
  fs::remove_all(root);
}

namespace {

// import_hf(dir) into a model of `shape` built from another seed (so every
// value checked comes from the checkpoint).
std::vector<Run> import_on_mesh(const std::string& dir, const zest::MeshShape& shape, bool tied) {
  return mesh_run::import_on_mesh(dir, shape, /*bucket=*/2000, model_options(tied, 0, kSeed + 1));
}

}  // namespace

TEST_CASE("llama over a mesh: a Hugging Face checkpoint read as each rank's tp slices, extras named over the mesh") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / fmt::format("zest_test_llama_mesh_import_{}", ::getpid());
  fs::remove_all(root);
  fs::create_directories(root);
  // The trained one-rank model's fp32 checkpoint, in several shards.
  const Run one = train(std::nullopt, 0, {.export_dir = root.string()}).at(0);
  const zest::MeshShape shape{.dp = 2, .tp = 2, .pp = 2};
  const std::vector<Run> mesh = import_on_mesh((root / "after_hf").string(), shape, false);
  for (size_t rank = 0; rank < mesh.size(); ++rank) {
    CAPTURE(rank);
    for (const auto& [name, value] : mesh[rank].masters) {
      CAPTURE(name);
      // fp32 to fp32: the bits of the one-rank model's slice.
      CHECK(torch::equal(value, llama::part_of_whole(name, one.masters.at(name), mesh[rank].tp_rank, 2)));
    }
  }
  // Every tensor is some stage's: none is extra on a pipeline. A tied model
  // has no lm_head anywhere on the mesh: named on every rank.
  CHECK_THROWS_WITH(import_on_mesh((root / "after_hf").string(), shape, true),
                    doctest::Contains("extra: tensor 'lm_head.weight' is not a registered parameter of any rank"));
  fs::remove_all(root);
}

TEST_CASE("llama over a mesh: LoRA on the split layers trains the one-rank adapters, the base frozen") {
  // Rank 4 adapters (lr 1e-2, alpha 16) on every projection: on tp 2 x pp 2
  // (and 2 replicas) against one rank within the tolerance at the top of
  // this file, and bit for bit across ZeRO stages.
  const Run one = train(std::nullopt, 0, {.lora_r = 4}).at(0);
  CHECK(one.losses.back() < one.losses.front());
  llama::LlamaForCausalLM base(tiny(false), kSeed);
  const auto initial = base->named_parameters();
  int adapters = 0;
  for (const auto& [name, value] : one.masters) {
    if (!zest::is_lora_adapter(name)) {
      CHECK(torch::equal(value, initial[name]));  // frozen
    } else if (name.ends_with("lora_B.weight")) {
      ++adapters;
      CHECK(value.abs().max().item<double>() > 0);  // trained from zero
    }
  }
  CHECK(adapters == 2 * 7);
  for (const zest::MeshShape shape : {zest::MeshShape{.dp = 1, .tp = 2, .pp = 2}, zest::MeshShape{.dp = 2, .tp = 2, .pp = 1}}) {
    CAPTURE(shape.str());
    const std::vector<Run> stage0 = train(shape, 0, {.lora_r = 4});
    check_against_whole(stage0, one, shape.dp);
    // A column-parallel layer keeps A whole and B's rows; a row-parallel
    // one A's columns and B whole.
    CHECK(stage0[0].masters.at("model.layers.0.self_attn.q_proj.lora_A.weight").sizes() == torch::IntArrayRef{4, 16});
    CHECK(stage0[0].masters.at("model.layers.0.self_attn.q_proj.lora_B.weight").sizes() == torch::IntArrayRef{12, 4});
    CHECK(stage0[0].masters.at("model.layers.0.mlp.down_proj.lora_A.weight").sizes() == torch::IntArrayRef{4, 12});
    CHECK(stage0[0].masters.at("model.layers.0.mlp.down_proj.lora_B.weight").sizes() == torch::IntArrayRef{16, 4});
    check_same_bits(stage0, train(shape, 3, {.lora_r = 4}));
  }
}

}  // namespace test_llama_mesh
