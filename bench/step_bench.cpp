// One training step of a model of P parameters on W in-process ranks at
// stages 0-3, with a trivial forward (a gather per unit) and backward (a
// constant gradient per unit), so the time is the engine's own: the
// gradient reduction, the norm, the optimizer and the parameter gathers.
//
// Each phase's time (StepResult::times, rank 0's host clock; the ranks run in
// lockstep through their collectives) is printed beside its bound and their
// ratio: the time of a memcpy, measured in this run (before and after each
// stage's steps, into buffers touched beforehand, median; on the host W
// memcpys at once, one per rank, as the ranks run at once), of the bytes
// one rank must read and write in that phase at the least (b bytes per
// element of the compute dtype, s = P/W elements owned, P at stage 0):
//   reduce     stages 1-3: reduce-scatter, (W+1)s·b (W slices read, one
//              written); stage 0: all-reduce, twice that; one rank: none
//              (Note [one rank reduces nothing])
//   norm       s·b read (the shard's gradient)
//   optimizer  AdamW with an fp32 master: 12 read + 12 written per element,
//              plus the gradient read and the parameter written (2b)
//   gather     stages 1-2: W·s·b read and written; stage 3: once per
//              gather, forward gathering every unit and backward those that
//              stage3_max_reuse_distance did not keep gathered since their
//              forward (Note [stage-3 reuse distance]: at DeepSpeed's
//              default, 1e9, none below 5e8 parameters; at 0 every unit:
//              twice); one rank: none (Note [one partition keeps stage 3
//              resident])
//   other      the rest of the step: backward's gradient buffers zeroed by
//              grads() and written by the caller, P·b written twice
// A memcpy of n bytes reads n and writes n, so a phase moving B bytes is
// bounded by the memcpy of B/2 bytes; the step's bound is the sum of its
// phases'. The targets (issue 24): norm <= 1.5x, gather <= 1.3x, optimizer
// <= 1.0x, the step <= 1.3x, and stage 3's step at most 1.2x stage 2's.
//
// The "backward" copies each unit's gradients from a buffer of the value.
// --device cuda:N runs the ranks on that GPU (sharing it) and bounds each
// phase by a device-to-device copy instead, the gradients' buffer there
// too, and each step's time includes waiting for its stream.
//
//   step_bench [--params N] [--ranks W] [--units U] [--steps N] [--stages 0,1,2,3] [--dtype bf16|fp32]
//              [--device host|cuda:N] [--reuse-distance N] [--prefetch N]
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <latch>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cli/cli.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/core/check.h"
#include "zest/core/float16.h"
#include "zest/engine/engine.h"
#include "zest/memory/copy.h"
#include "zest/memory/raw_allocator.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  size_t params = size_t{1} << 24;
  int ranks = 2;
  int units = 8;
  int steps = 5;  // timed, after one untimed
  std::vector<int> stages = {0, 1, 2, 3};
  zest::DType dtype = zest::DType::kBFloat16;
  zest::Device device = zest::Device::host();
  int64_t reuse_distance = 1'000'000'000;  // stage3_max_reuse_distance: DeepSpeed's default
  int64_t prefetch = 50'000'000;           // stage3_prefetch_bucket_size: DeepSpeed's default

  // Stage 3: the units gathered again in backward. The loop releases each
  // unit before the next gather, so unit k (of equal ones) is kept when the
  // units after it, counted forward and backward, hold fewer parameters
  // than the distance.
  int regathered_units() const {
    const auto per_unit = static_cast<int64_t>(params / static_cast<size_t>(units));
    int n = 0;
    for (int k = 0; k < units; ++k) n += 2 * int64_t{units - 1 - k} * per_unit >= reuse_distance ? 1 : 0;
    return n;
  }
};

struct Phases {
  double step = 0, reduce = 0, norm = 0, optimizer = 0, gather = 0;  // ms
  // Rank 0's MemoryReport after the steps: the allocator's peak, and the
  // parameters' (stage 3: shards plus what was gathered at once).
  int64_t peak_allocated = 0, params_peak = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The load average, recorded with each run (the timings are only as quiet
// as the machine).
std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return in ? fmt::format("{} {} {}", a, b, c) : std::string("unknown");
}

// Times memcpys of up to `capacity` bytes between buffers allocated and
// touched once, as the engine's buffers are after its first step, so that
// no bound pays for page faults the step does not; from the allocator the
// engine's memory comes from (on the host in the same pages: Note [host
// memory in huge pages] in memory/raw_allocator.cpp). On the host the W
// in-process ranks run their phases at once, sharing the cores and the
// memory bus: the bound is then W threads each copying its own bytes at
// once, the slowest one's time.
class CopyBound {
 public:
  CopyBound(zest::Device device, int ranks, size_t capacity) : device_(device) {
    if (capacity == 0) return;
    if (device.is_host()) {
      alloc_.emplace(zest::make_host_allocator());
      const zest::Stream host = zest::Stream::default_for(device);
      host_.resize(static_cast<size_t>(ranks));
      for (HostPair& h : host_) {
        h.src = alloc_->allocate_buffer(capacity, host);
        h.dst = alloc_->allocate_buffer(capacity, host);
        std::memset(h.src.data(), 1, capacity);
        std::memset(h.dst.data(), 0, capacity);
      }
      return;
    }
    alloc_.emplace(zest::make_cuda_allocator(device.index()));
    stream_.emplace(device);
    src_ = alloc_->allocate_buffer(capacity, *stream_);
    dst_ = alloc_->allocate_buffer(capacity, *stream_);
    zest::fill_zero(*stream_, src_.data(), capacity);
    zest::fill_zero(*stream_, dst_.data(), capacity);
    stream_->get().synchronize();
  }

  // The time of a memcpy of `bytes` (on the host one per rank, at once; on
  // a GPU one device-to-device copy on one stream), in ms.
  double once(size_t bytes) {
    if (bytes == 0) return 0.0;
    if (!device_.is_host()) {
      const auto t0 = Clock::now();
      zest::copy_bytes(*stream_, dst_.data(), src_.data(), bytes);
      stream_->get().synchronize();
      return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    }
    ZEST_INTERNAL_ASSERT(!host_.empty() && bytes <= host_[0].src.size_bytes());
    std::vector<double> ms(host_.size());
    std::latch start(static_cast<std::ptrdiff_t>(host_.size()));
    const auto copy = [&](size_t r) {
      start.arrive_and_wait();
      const auto t0 = Clock::now();
      std::memcpy(host_[r].dst.data(), host_[r].src.data(), bytes);
      ms[r] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    };
    std::vector<std::thread> others;
    for (size_t r = 1; r < host_.size(); ++r) others.emplace_back(copy, r);
    copy(0);
    for (std::thread& t : others) t.join();
    return *std::max_element(ms.begin(), ms.end());
  }

 private:
  struct HostPair {
    zest::Buffer src, dst;
  };
  zest::Device device_;
  std::optional<zest::CachingAllocator> alloc_;  // before the buffers: they go first
  std::optional<zest::OwnedStream> stream_;
  std::vector<HostPair> host_;
  zest::Buffer src_, dst_;
};

// 1e-3 into the gradient of `p`, copied from `source`, a buffer on the
// stream's device of at least its size holding that value. On the host too:
// GCC 12 at -O2 filled a bf16 array one 2-byte store at a time (7.5 ms for
// 16M elements, against 1 ms for a copy of their bytes).
template <typename T>
void fill_grad(zest::GradHandle& g, const zest::ParamLayout& p, const zest::Stream& stream, const void* source) {
  std::span<T> v = g.grad<T>(p.name);
  zest::copy_bytes(stream, v.data(), source, v.size_bytes());
}

// A buffer of `n` gradients of 1e-3 in `dtype` on the stream's device, for
// fill_grad.
zest::Buffer grad_source(zest::CachingAllocator& alloc, const zest::Stream& stream, zest::DType dtype, size_t n) {
  zest::Buffer out = alloc.allocate_buffer(n * zest::elem_size(dtype), stream);
  if (dtype == zest::DType::kBFloat16) {
    const std::vector<zest::bf16> v(n, zest::bf16(1e-3f));
    zest::copy_bytes(stream, out.data(), v.data(), out.size_bytes());
    stream.synchronize();  // before `v` goes
  } else {
    const std::vector<float> v(n, 1e-3f);
    zest::copy_bytes(stream, out.data(), v.data(), out.size_bytes());
    stream.synchronize();
  }
  return out;
}

// Rank 0's phases of `opt.steps` steps at `stage`, medians.
Phases run_stage(const Options& opt, int stage) {
  zest::EngineConfig config;
  config.zero.stage = stage;
  config.zero.stage3_param_persistence_threshold = 0;
  config.zero.stage3_max_reuse_distance = opt.reuse_distance;
  config.zero.stage3_prefetch_bucket_size = opt.prefetch;
  config.bf16 = opt.dtype == zest::DType::kBFloat16;
  const size_t per_unit = opt.params / static_cast<size_t>(opt.units);
  std::vector<std::vector<double>> ms(5);
  int64_t peak_allocated = 0, params_peak = 0;
  zest::run_inprocess(opt.ranks, [&](zest::Communicator& comm) {
    const auto make_allocator = [&] {
      return zest::CachingAllocator(opt.device.is_cuda() ? zest::make_cuda_allocator(opt.device.index())
                                                         : zest::make_host_allocator());
    };
    zest::CachingAllocator alloc = make_allocator();
    const zest::OwnedStream stream(opt.device);
    // From an allocator of its own, so that the engine's memory report
    // counts the engine's buffers alone.
    zest::CachingAllocator source_alloc = make_allocator();
    const zest::Buffer source = grad_source(source_alloc, stream, opt.dtype, per_unit);
    zest::Engine engine(config, comm, alloc, stream);
    for (int u = 0; u < opt.units; ++u) {
      engine.add_unit(fmt::format("u{}", u), {{fmt::format("u{}.w", u), {static_cast<int64_t>(per_unit)}}});
    }
    engine.finalize([](const zest::ParamLayout&, std::span<float> v) { std::fill(v.begin(), v.end(), 0.01f); },
                    zest::InitFrom::kEveryRank);
    for (int s = 0; s <= opt.steps; ++s) {
      const auto t0 = Clock::now();
      for (int u = 0; u < opt.units; ++u) zest::UnitHandle h = engine.gather(u);  // forward
      for (int u = opt.units - 1; u >= 0; --u) {                                   // backward
        zest::UnitHandle h = engine.gather(u);
        zest::GradHandle g = engine.grads(u);
        for (const zest::ParamLayout& p : engine.layout().unit(u).params) {
          if (opt.dtype == zest::DType::kBFloat16) fill_grad<zest::bf16>(g, p, stream, source.data());
          else fill_grad<float>(g, p, stream, source.data());
        }
        g.done();
      }
      const zest::StepResult r = engine.step();
      stream.get().synchronize();  // the step's device work is part of its time
      const double step_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      ZEST_CHECK(r.applied, "step_bench: step {} was not applied: {}", s, r.skip_reason);
      if (s == 0 || comm.rank() != 0) continue;  // the first step allocates
      const double per[] = {step_ms, r.times.reduce_ms, r.times.norm_ms, r.times.optimizer_ms,
                            r.times.gather_ms};
      for (size_t k = 0; k < 5; ++k) ms[k].push_back(per[k]);
    }
    if (comm.rank() == 0) {
      const zest::MemoryReport m = engine.memory_report();
      peak_allocated = m.peak_allocated;
      params_peak = m[zest::MemoryCategory::kParameters].peak;
    }
  }, opt.device);
  return {median(ms[0]), median(ms[1]), median(ms[2]), median(ms[3]), median(ms[4]), peak_allocated, params_peak};
}

// Throws cli::UsageError for --help and for a bad flag; `usage` is the help
// either way.
Options parse(int argc, char** argv, std::string& usage) {
  Options o;
  std::string dtype = "bf16";
  cli::App app("step_bench: one engine step on W in-process ranks at stages 0-3 against memcpy bounds", "step_bench");
  app.add_option("--params", o.params, "parameters P")->check(cli::Range(size_t{1}, size_t{1} << 40));
  app.add_option("--ranks", o.ranks, "in-process ranks W")->check(cli::Range(1, 1024));
  app.add_option("--units", o.units, "units the parameters are split into")->check(cli::Range(1, 1 << 20));
  app.add_option("--steps", o.steps, "timed steps, after one untimed")->check(cli::Range(1, 1000));
  app.add_option("--stages", o.stages, "ZeRO stages to run, comma-separated")
      ->delimiter(',')
      ->check(cli::Range(0, 3));
  app.add_option("--dtype", dtype, "compute dtype")->check(cli::IsMember({"bf16", "fp32"}));
  std::string device = "host";
  app.add_option("--device", device, "host or cuda:N");
  app.add_option("--reuse-distance", o.reuse_distance,
                 "stage3_max_reuse_distance (elements; DeepSpeed's default 1e9; 0 gathers every unit again in "
                 "backward)")
      ->check(cli::Range(int64_t{0}, int64_t{1} << 50));
  app.add_option("--prefetch", o.prefetch,
                 "stage3_prefetch_bucket_size (elements; DeepSpeed's default 5e7, the whole of a model this size)")
      ->check(cli::Range(int64_t{0}, int64_t{1} << 50));
  usage = app.help();
  cli::parse(app, argc, argv);
  if (o.params < static_cast<size_t>(o.units)) {
    cli::usage_error("--params {} is fewer than --units {}", o.params, o.units);
  }
  o.dtype = zest::parse_dtype(dtype);
  o.device = zest::parse_device(device);
  zest::check_device_available(o.device);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  std::string usage;
  try {
    opt = parse(argc, argv, usage);
  } catch (const cli::UsageError& e) {
    return cli::usage_exit("step_bench", e, usage);
  }
  try {
    const double P = static_cast<double>(opt.params);
    const double W = opt.ranks;
    const double b = static_cast<double>(zest::elem_size(opt.dtype));
    const double master = opt.dtype == zest::DType::kFloat32 ? 0.0 : 8.0;  // fp32 copy read + written
    fmt::print("step_bench: P = {} parameters in {} units, W = {} in-process ranks on {}, {}, AdamW, {} steps "
               "(median; {} build); stage3_max_reuse_distance {} ({} of {} units gathered again in backward), "
               "stage3_prefetch_bucket_size {}; load {}\n",
               opt.params, opt.units, opt.ranks, opt.device.str(), zest::dtype_name(opt.dtype), opt.steps,
               ZEST_BENCH_BUILD_TYPE, opt.reuse_distance, opt.regathered_units(), opt.units, opt.prefetch, loadavg());
    fmt::print("each cell: ms (bound ms) time/bound\n");
    fmt::print("{:>5} | {:>22} | {:>22} {:>22} {:>22} {:>22} {:>22}\n", "stage", "step", "reduce", "norm",
               "optimizer", "gather", "other");
    // The bytes each phase moves (read + written) at `stage`.
    const auto phase_bytes = [&](int stage) {
      const double s = P / (stage == 0 ? 1.0 : W);  // owned elements
      const double reduce = W == 1 ? 0.0 : (stage == 0 ? 2.0 : 1.0) * (W + 1) * (P / W) * b;
      const double norm = s * b;
      const double optim = s * (16.0 + master + 2 * b);
      const double gathers = stage == 3 ? 1.0 + double(opt.regathered_units()) / opt.units : 1.0;
      const double gather = stage == 0 || W == 1 ? 0.0 : gathers * 2 * P * b;
      const double other = 2 * P * b;
      return std::array<double, 5>{reduce, norm, optim, gather, other};
    };
    double most = 0;
    for (int stage : opt.stages) {
      for (double bytes : phase_bytes(stage)) most = std::max(most, bytes / 2);
    }
    CopyBound copy(opt.device, opt.ranks, static_cast<size_t>(most));
    std::optional<double> stage2, stage3;
    std::vector<std::pair<int64_t, int64_t>> peaks;
    for (int stage : opt.stages) {
      const std::array<double, 5> bytes = phase_bytes(stage);
      // Bound samples before and after the stage's steps, so that a change
      // in the machine's load during the run shows in both.
      std::array<std::vector<double>, 5> samples;
      const auto sample_bounds = [&] {
        for (int i = 0; i < opt.steps; ++i) {
          for (size_t k = 0; k < bytes.size(); ++k) samples[k].push_back(copy.once(static_cast<size_t>(bytes[k] / 2)));
        }
      };
      sample_bounds();
      const Phases p = run_stage(opt, stage);
      peaks.emplace_back(p.peak_allocated, p.params_peak);
      sample_bounds();
      std::array<double, 5> bound{};
      for (size_t k = 0; k < bound.size(); ++k) bound[k] = median(samples[k]);
      double step_bound = 0;
      for (double x : bound) step_bound += x;
      const double other = std::max(0.0, p.step - (p.reduce + p.norm + p.optimizer + p.gather));
      if (stage == 2) stage2 = p.step;
      if (stage == 3) stage3 = p.step;
      const auto cell = [](double t, double bnd) {
        return bnd > 0 ? fmt::format("{:7.2f} ({:6.2f}) {:5.2f}", t, bnd, t / bnd)
                       : fmt::format("{:7.2f} ({:6.2f})   -  ", t, bnd);
      };
      fmt::print("{:>5} | {:>22} | {:>22} {:>22} {:>22} {:>22} {:>22}\n", stage, cell(p.step, step_bound),
                 cell(p.reduce, bound[0]), cell(p.norm, bound[1]), cell(p.optimizer, bound[2]), cell(p.gather, bound[3]),
                 cell(other, bound[4]));
    }
    for (size_t i = 0; i < opt.stages.size(); ++i) {
      fmt::print("stage {} memory (rank 0's engine): peak {:.1f} MiB, parameters' peak {:.1f} MiB\n", opt.stages[i],
                 double(peaks[i].first) / (1 << 20), double(peaks[i].second) / (1 << 20));
    }
    if (stage2 && stage3) fmt::print("stage 3 / stage 2 step: {:.2f} (target <= 1.2)\n", *stage3 / *stage2);
    fmt::print("load after: {}\n", loadavg());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "step_bench: %s\n", e.what());
    return 1;
  }
}
