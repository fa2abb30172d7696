#include "mesh_run.h"

#include <algorithm>
#include <span>

#include "zest/checkpoint/safetensors.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/core/file_io.h"
#include "zest/memory/raw_allocator.h"

namespace mesh_run {

zest::EngineConfig config(int stage, int64_t bucket) {
  zest::EngineConfig c;
  c.zero.stage = stage;
  c.zero.stage3_param_persistence_threshold = 0;  // every unit sharded
  c.zero.reduce_bucket_size = bucket;
  c.optimizer.lr = 1e-2f;
  c.optimizer.beta2 = 0.95f;
  c.optimizer.eps = 1e-6f;
  c.gradient_clipping = 0.05;
  c.gradient_accumulation_steps = kMicroBatches;
  return c;
}

std::vector<Run> train(const std::string& corpus_text, std::optional<zest::MeshShape> shape, int stage,
                       int64_t bucket, const Options& o) {
  const examples::Corpus corpus = examples::Corpus::from_text(corpus_text);
  const int world = shape ? shape->world() : 1;
  std::vector<Run> runs(static_cast<size_t>(world));
  zest::run_inprocess(world, [&](zest::Communicator& comm) {
    torch::set_num_threads(1);
    std::optional<zest::DeviceMesh> mesh;
    if (shape) mesh.emplace(comm, *shape);
    zest::Communicator& dp = mesh ? mesh->dp() : comm;
    zest::CachingAllocator alloc(zest::make_host_allocator());
    zest::Engine engine(config(stage, bucket), dp, alloc, zest::Stream::default_for(comm.device()));
    if (mesh) engine.set_model_parallel(mesh->engine_model_parallel());
    Model model = o.build(examples::placement_of(mesh ? &*mesh : nullptr));
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& item : model.module->named_parameters()) shapes[item.key()] = item.value().sizes().vec();
    const std::unique_ptr<zest::TorchModule> zt = o.wrap(engine, model);
    if (o.after_wrap) o.after_wrap(*zt, model);
    if (!o.load.empty()) zt->load(o.load);
    const int64_t rows = kRows / dp.size() / kMicroBatches;
    examples::MeshTrainer trainer(mesh ? &*mesh : nullptr, *zt, *model.lm, rows, kContext, o.schedule);
    if (o.on_weights) o.on_weights(*zt, "before");
    Run& r = runs[static_cast<size_t>(comm.rank())];
    r.tp_rank = model.lm->placement().tp_rank();
    r.tp_size = model.lm->placement().tp_size();
    for (int s = o.first; s < o.last; ++s) {
      std::vector<examples::Batch> micro;
      for (int m = 0; m < kMicroBatches; ++m) {
        micro.push_back(corpus.train_batch(s, dp.rank() * rows * kMicroBatches + m * rows, rows, kContext, o.seed));
      }
      const examples::MeshTrainer::Step step = trainer.train_step(micro);
      REQUIRE(step.result.applied);
      CHECK(step.result.clipped);
      r.losses.push_back(step.loss);
      r.norms.push_back(step.result.grad_norm);
    }
    if (!o.save.empty()) zt->save(o.save);
    if (o.on_weights) o.on_weights(*zt, "after");
    r.val_loss = trainer.validation_loss(corpus, 2);
    r.next_logits = trainer.last_logits(examples::encode("Look "));
    if (o.sample) r.sample = o.sample(trainer);
    for (const auto& [name, sizes] : shapes) r.masters[name] = torch::tensor(engine.param_master(name)).reshape(sizes);
  });
  return runs;
}

std::vector<Run> import_on_mesh(const std::string& dir, const zest::MeshShape& shape, int64_t bucket,
                                const Options& o) {
  std::vector<Run> runs(static_cast<size_t>(shape.world()));
  zest::run_inprocess(shape.world(), [&](zest::Communicator& comm) {
    torch::set_num_threads(1);
    zest::DeviceMesh mesh(comm, shape);
    zest::CachingAllocator alloc(zest::make_host_allocator());
    zest::Engine engine(config(3, bucket), mesh.dp(), alloc, zest::Stream::default_for(comm.device()));
    engine.set_model_parallel(mesh.engine_model_parallel());
    Model model = o.build(examples::placement_of(&mesh));
    std::map<std::string, std::vector<int64_t>> shapes;  // before stage 3 releases the parameters
    for (const auto& item : model.module->named_parameters()) shapes[item.key()] = item.value().sizes().vec();
    const std::unique_ptr<zest::TorchModule> zt = o.wrap(engine, model);
    zt->import_hf(dir);
    Run& r = runs[static_cast<size_t>(comm.rank())];
    r.tp_rank = mesh.tp_rank();
    r.tp_size = shape.tp;
    for (const auto& [name, sizes] : shapes) r.masters[name] = torch::tensor(engine.param_master(name)).reshape(sizes);
  });
  return runs;
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

void check_against_whole(const std::vector<Run>& mesh, const Run& whole, int dp, const PartOfWhole& part_of_whole) {
  for (size_t rank = 0; rank < mesh.size(); ++rank) {
    CAPTURE(rank);
    const Run& r = mesh[rank];
    REQUIRE(r.norms.size() == whole.norms.size());
    for (size_t s = 0; s < r.norms.size(); ++s) {
      CHECK(relative(r.norms[s], whole.norms[s]) < 1e-5);
      if (dp == 1) CHECK(relative(r.losses[s], whole.losses[s]) < 1e-5);
    }
    CHECK(relative(r.val_loss, whole.val_loss) < 1e-5);
    CHECK((r.next_logits - whole.next_logits).abs().max().item<double>() < 1e-5);
    CHECK(r.sample == whole.sample);
    for (const auto& [name, value] : r.masters) {
      CAPTURE(name);
      const torch::Tensor expect = part_of_whole(name, whole.masters.at(name), r.tp_rank, r.tp_size);
      REQUIRE(value.sizes() == expect.sizes());
      CHECK((value - expect).abs().max().item<double>() < 1e-5);
    }
  }
}

void check_same_bits(const std::vector<Run>& a, const std::vector<Run>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t rank = 0; rank < a.size(); ++rank) {
    CAPTURE(rank);
    CHECK(a[rank].losses == b[rank].losses);
    CHECK(a[rank].norms == b[rank].norms);
    CHECK(a[rank].val_loss == b[rank].val_loss);
    CHECK(torch::equal(a[rank].next_logits, b[rank].next_logits));
    CHECK(a[rank].sample == b[rank].sample);
    for (const auto& [name, value] : a[rank].masters) {
      CAPTURE(name);
      CHECK(torch::equal(value, b[rank].masters.at(name)));
    }
  }
}

void check_every_mesh(const Run& whole, const TrainOnMesh& train, const PartOfWhole& part_of_whole) {
  for (const int dp : {1, 2}) {
    for (const int tp : {1, 2}) {
      for (const int pp : {1, 2}) {
        const zest::MeshShape shape{.dp = dp, .tp = tp, .pp = pp};
        CAPTURE(shape.str());
        const std::vector<Run> stage0 = train(shape, 0);
        check_against_whole(stage0, whole, dp, part_of_whole);
        for (const int stage : {1, 2, 3}) {
          CAPTURE(stage);
          check_same_bits(stage0, train(shape, stage));
        }
      }
    }
  }
}

std::vector<std::string> check_parts_of(const torch::nn::Module& whole, const torch::nn::Module& part, int r, int t,
                                        const PartOfWhole& part_of_whole) {
  std::map<std::string, torch::Tensor> expect;
  for (const auto& item : whole.named_parameters()) expect[item.key()] = item.value();
  std::vector<std::string> names;
  for (const auto& item : part.named_parameters()) {
    CAPTURE(item.key());
    names.push_back(item.key());
    REQUIRE(expect.count(item.key()) == 1);
    CHECK(torch::equal(item.value(), part_of_whole(item.key(), expect.at(item.key()), r, t)));
  }
  return names;
}

std::string file_bytes(const std::filesystem::path& path) { return zest::read_text_file(path.string()); }

std::map<std::string, std::string> dir_bytes(const std::filesystem::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out[e.path().filename().string()] = file_bytes(e);
  return out;
}

void check_close_files(const std::filesystem::path& a, const std::filesystem::path& b, double tolerance) {
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
    CHECK(worst < tolerance);
  }
}

void check_close_hf_dirs(const std::filesystem::path& a, const std::filesystem::path& b, double tolerance) {
  const std::map<std::string, std::string> fa = dir_bytes(a), fb = dir_bytes(b);
  REQUIRE(fa.size() == fb.size());
  for (const auto& [name, bytes] : fa) {
    CAPTURE(name);
    REQUIRE(fb.count(name) == 1);
    if (name.ends_with(".safetensors")) {
      check_close_files(a / name, b / name, tolerance);
    } else {
      CHECK(fb.at(name) == bytes);
    }
  }
}

}  // namespace mesh_run
