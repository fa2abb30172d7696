#include "runs.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/describe_model.h"
#include "task.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/memory/raw_allocator.h"

namespace memory_compare {
namespace {

int64_t requested_peak(const zest::CachingAllocator& allocator) {
  return zest::at(allocator.stats().requested_bytes, zest::StatPool::kAggregate).peak;
}

// One rank: set up, measure, reset the peaks, train, measure again.
RankMemory train_rank(const Options& opt, const zest::EngineConfig& config, zest::Communicator& comm,
                      zest::ModelDescription* model) {
  zest::CachingAllocator allocator(zest::make_host_allocator());
  zest::Engine engine(config, comm, allocator, zest::Stream::default_for(comm.device()));
  mlp::register_layers(engine, opt.shape);
  engine.finalize([&](const zest::ParamLayout& p, std::span<float> v) { mlp::init_parameter(p, v, opt.seed); });
  if (model != nullptr) *model = examples::describe_model(engine.layout());

  RankMemory m;
  m.after_finalize = engine.memory_report();
  m.setup_peak_total = requested_peak(allocator);
  allocator.reset_peak_stats();

  const mlp::Teacher teacher(opt.shape, opt.seed + 1);
  const int rows = opt.rows_per_rank;
  for (long step = 0; step < opt.steps; ++step) {
    mlp::forward_backward(engine, opt.shape, teacher.batch(step, comm.rank() * rows, rows));
    engine.step();
  }
  m.at_end = engine.memory_report();
  m.training_peak_total = requested_peak(allocator);
  return m;
}

}  // namespace

int64_t RankMemory::run_peak(zest::MemoryCategory c) const {
  return std::max(after_finalize[c].peak, at_end[c].peak);
}


std::string RankMemory::difference(const RankMemory& other) const {
  std::string out;
  const auto compare = [&](const std::string& what, int64_t mine, int64_t theirs) {
    if (mine != theirs) out += fmt::format("{}{} {} B vs {} B", out.empty() ? "" : ", ", what, mine, theirs);
  };
  for (zest::MemoryCategory c : zest::kAllMemoryCategories) {
    const std::string name(zest::category_name(c));
    compare(name + " after finalize", after_finalize[c].current, other.after_finalize[c].current);
    compare(name + " set-up peak", after_finalize[c].peak, other.after_finalize[c].peak);
    compare(name + " at end", at_end[c].current, other.at_end[c].current);
    compare(name + " training peak", at_end[c].peak, other.at_end[c].peak);
  }
  compare("set-up peak total", setup_peak_total, other.setup_peak_total);
  compare("training peak total", training_peak_total, other.training_peak_total);
  return out;
}

std::vector<std::string> Comparison::mismatches() const {
  std::vector<std::string> out;
  for (zest::MemoryCategory c : kModelStates) {
    const int64_t measured_bytes = measured.current(c);
    const int64_t estimated = estimate[c].persistent;
    if (measured_bytes != estimated) {
      out.push_back(fmt::format("stage {}, {} ranks: {} measured {} B, estimated {} B ({:+} B)", stage, world,
                                zest::category_name(c), measured_bytes, estimated, measured_bytes - estimated));
    }
  }
  return out;
}

Comparison run_comparison(const Options& opt, int stage, int world) {
  const zest::EngineConfig config = engine_config(opt, stage);
  Comparison c;
  c.stage = stage;
  c.world = world;
  // Each rank writes only its own slot; run_inprocess joins the threads
  // before the slots are read.
  std::vector<RankMemory> ranks(static_cast<size_t>(world));
  zest::run_inprocess(world, [&](zest::Communicator& comm) {
    ranks[static_cast<size_t>(comm.rank())] = train_rank(opt, config, comm, comm.rank() == 0 ? &c.model : nullptr);
  }, zest::Device::host(), opt.comm);
  c.measured = ranks[0];
  for (int r = 1; r < world; ++r) {
    const std::string d = ranks[static_cast<size_t>(r)].difference(ranks[0]);
    if (!d.empty()) c.rank_differences.push_back(fmt::format("stage {}, {} ranks: rank {} vs rank 0: {}", stage, world, r, d));
  }
  c.estimate = zest::estimate_memory(c.model, zest::EstimateOptions::from_config(config, world));
  return c;
}

}  // namespace memory_compare
