// The optimizer step of offload_optimizer for a model of P parameters on
// one rank: the time of its three stages (reduced gradients device->host,
// the host optimizer's update, new parameters host->device) and of the
// pipeline that runs them at once, chunk by chunk (engine/detail/optimizer_offload.h).
//
// overlap = (d2h + update + h2d - pipeline) / (d2h + update + h2d - slowest)
// is 1 when the pipeline takes only as long as its slowest stage (the bound)
// and 0 when the stages run one after another. Target (issue 15): >= 70%.
// The same run also steps the model without offload, and prints the step
// time of both and their ratio.
//
// On the host backend the "device" is host memory and the copies run on the
// copy queue's thread (memory/copy_queue.h), so the figures are those of the
// pipeline's scheduling on this CPU, not of a PCIe link. Every stage's time
// is StepResult::times (host clock; on CUDA the copies are timed by events).
//
// --nvme DIR offloads to a swap file in DIR instead (offload_optimizer
// device "nvme", engine/detail/offload_swap.h): the update then also waits for the
// ring's reads and writes, and the step is compared with CPU offload's.
// The step's I/O is then timed alone in the same run, on a swap file of
// the engine's geometry in DIR (its records, buffer_count ring buffers,
// both regions): reading a region alone, writing one alone, and the step's
// pattern with no update (read one region, write the other: io). The split
// is read, write, io, update (the host optimizer in the step), and
// overlap = (io + update - pipeline) / min(io, update): 100% when the step
// takes only as long as the longer of its I/O and its update, 0% when it
// takes their sum. That comparison is of two runs of the drive; the step
// also reports what its own stream saw (StepTimes: the update thread
// blocked on reads and on writes, the chunks' time, and of it the part the
// drive was busy throughout, nvme/swap_ring.h), whose ratio is the overlap
// in the stream, unblurred by a drive whose speed drifts.
//
//   offload_bench [--params N] [--units U] [--steps N] [--stage 1|2|3] [--dtype bf16|fp32]
//                 [--host-threads T] [--device host|cuda:N] [--pin] [--nvme DIR] [--buffer-count B]
#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/cli.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/core/check.h"
#include "zest/core/float16.h"
#include "zest/engine/engine.h"
#include "zest/memory/copy.h"
#include "zest/memory/raw_allocator.h"
#include "zest/nvme/aio_backend.h"
#include "zest/nvme/swap_file.h"
#include "zest/nvme/swap_ring.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int64_t params = int64_t{1} << 24;
  int units = 8;
  int steps = 5;  // timed, after one untimed
  int stage = 2;
  int host_threads = 1;
  std::string dtype = "bf16";
  std::string device = "host";
  bool pin = false;
  std::string nvme;  // the swap files' directory; empty: host memory
  int buffer_count = 4;  // offload_optimizer.buffer_count (--nvme)
};

// The step's I/O alone, on a swap file of the engine's geometry (from
// memory_report: the file holds two regions; the ring is buffer_count
// records and 4096 bytes, Note [swap ring in the host allocator]): a region
// read, a region written, and one read into the other written (the step's
// pattern with no update). Timed between the engine's steps, so that the
// drive's state (a shared virtio disk here) drifts alike for both.
class IoProbe {
 public:
  IoProbe(const std::string& dir, const zest::MemoryReport& m, int buffer_count)
      : region_(static_cast<uint64_t>(m.nvme_bytes()) / 2),
        record_(static_cast<size_t>(m.host_swap_buffers - 4096) / static_cast<size_t>(buffer_count)),
        file_(zest::SwapFile::create(dir, {.bytes = 2 * region_})),
        io_(zest::make_aio_backend(zest::AioConfig{})),
        ring_(file_, *io_, {.buffer_count = buffer_count, .buffer_size = record_}) {
    ZEST_CHECK(region_ > 0 && m.host_swap_buffers > 4096, "offload_bench: the nvme run reported no swap file");
    // Both regions written once: a preallocated extent reads without
    // touching the drive.
    ring_.stream(0, 2 * region_, zest::StreamMode::kWrite, nothing);
  }
  // Read, write, read-and-write ms of one round.
  std::array<double, 3> round() {
    return {timed([&] { ring_.stream(0, region_, zest::StreamMode::kRead, nothing); }),
            timed([&] { ring_.stream(region_, region_, zest::StreamMode::kWrite, nothing); }),
            timed([&] { ring_.stream_to(0, region_, region_, nothing); })};
  }
  uint64_t region_bytes() const { return region_; }
  size_t record_bytes() const { return record_; }

 private:
  static void nothing(int64_t, uint64_t, std::span<std::byte>) {}
  template <typename Fn>
  static double timed(Fn&& fn) {
    const auto t0 = Clock::now();
    fn();
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  uint64_t region_;
  size_t record_;
  zest::SwapFile file_;
  std::unique_ptr<zest::AioBackend> io_;
  zest::SwapRing ring_;
};

struct Times {
  double step = 0, optimizer = 0, d2h = 0, update = 0, h2d = 0, pipeline = 0;  // ms, medians
  // --nvme: the I/O alone, medians (ms), and its geometry.
  double read = 0, write = 0, io = 0;
  // --nvme, in the step (StepTimes): blocked on reads, on writes, the
  // chunks' update, and of that the part the drive was busy throughout.
  double read_wait = 0, write_wait = 0, chunk = 0, chunk_overlapped = 0;
  uint64_t region_bytes = 0;
  size_t record_bytes = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

enum class Mode { kNone, kCpu, kNvme };

Times run(const Options& opt, Mode mode) {
  const zest::Device device = zest::parse_device(opt.device);
  zest::EngineConfig config;
  config.zero.stage = opt.stage;
  config.zero.stage3_param_persistence_threshold = 0;
  config.bf16 = opt.dtype == "bf16";
  config.optimizer.host_threads = opt.host_threads;
  if (mode != Mode::kNone) {
    config.offload_optimizer.device = mode == Mode::kCpu ? zest::OffloadDevice::kCpu : zest::OffloadDevice::kNvme;
    config.offload_optimizer.nvme_path = mode == Mode::kNvme ? opt.nvme : "";
    config.offload_optimizer.pin_memory = opt.pin;
    config.offload_optimizer.buffer_count = opt.buffer_count;
  }
  const auto per_unit = static_cast<int64_t>(opt.params / opt.units);
  std::vector<std::vector<double>> ms(13);
  Times t;
  zest::run_inprocess(
      1,
      [&](zest::Communicator& comm) {
        zest::CachingAllocator alloc(device.is_cuda() ? zest::make_cuda_allocator(device.index())
                                                      : zest::make_host_allocator());
        const zest::OwnedStream stream(device);
        zest::Engine engine(config, comm, alloc, stream);
        for (int u = 0; u < opt.units; ++u) engine.add_unit(fmt::format("u{}", u), {{fmt::format("u{}.w", u), {per_unit}}});
        engine.finalize([](const zest::ParamLayout&, std::span<float> v) { std::fill(v.begin(), v.end(), 0.01f); },
                        zest::InitFrom::kEveryRank);
        std::unique_ptr<IoProbe> probe;
        if (mode == Mode::kNvme) {
          probe = std::make_unique<IoProbe>(opt.nvme, engine.memory_report(), opt.buffer_count);
          t.region_bytes = probe->region_bytes();
          t.record_bytes = probe->record_bytes();
        }
        // One unit's gradient, copied in (the device may be a GPU).
        const size_t bytes = static_cast<size_t>(per_unit) * zest::elem_size(engine.compute_dtype());
        std::vector<std::byte> grad(bytes);
        if (config.bf16) {
          std::fill_n(reinterpret_cast<zest::bf16*>(grad.data()), per_unit, zest::bf16(1e-3f));
        } else {
          std::fill_n(reinterpret_cast<float*>(grad.data()), per_unit, 1e-3f);
        }
        for (int s = 0; s <= opt.steps; ++s) {
          const auto t0 = Clock::now();
          for (int u = opt.units - 1; u >= 0; --u) {
            zest::UnitHandle h = engine.gather(u);
            zest::GradHandle g = engine.grads(u);
            zest::copy_bytes(stream, g.data(), grad.data(), bytes);
            stream.get().synchronize();
            g.done();
          }
          const zest::StepResult r = engine.step();
          stream.get().synchronize();
          const double step_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
          ZEST_CHECK(r.applied, "offload_bench: step {} was not applied: {}", s, r.skip_reason);
          if (s == 0) continue;  // the first step allocates
          const double per[] = {step_ms,
                                r.times.optimizer_ms,
                                r.times.offload_d2h_ms,
                                r.times.offload_update_ms,
                                r.times.offload_h2d_ms,
                                r.times.offload_ms,
                                r.times.offload_read_wait_ms,
                                r.times.offload_write_wait_ms,
                                r.times.offload_chunk_ms,
                                r.times.offload_chunk_overlapped_ms};
          for (size_t k = 0; k < 6; ++k) ms[k].push_back(per[k]);
          for (size_t k = 6; k < 10; ++k) ms[k + 3].push_back(per[k]);
          if (probe) {
            const std::array<double, 3> io = probe->round();
            for (size_t k = 0; k < 3; ++k) ms[6 + k].push_back(io[k]);
          }
        }
      },
      device);
  double* out[] = {&t.step,  &t.optimizer, &t.d2h,       &t.update,     &t.h2d,
                   &t.pipeline, &t.read,    &t.write,     &t.io,         &t.read_wait,
                   &t.write_wait, &t.chunk, &t.chunk_overlapped};
  for (size_t k = 0; k < 13; ++k) *out[k] = median(ms[k]);
  return t;
}

// Throws cli::UsageError for --help and for a bad flag; `usage` is the help
// either way.
Options parse(int argc, char** argv, std::string& usage) {
  Options o;
  cli::App app("offload_bench: the pipelined optimizer step of offload_optimizer", "offload_bench");
  app.add_option("--params", o.params, "parameters P")->check(cli::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--units", o.units, "units the parameters are split into")->check(cli::Range(1, 1 << 20));
  app.add_option("--steps", o.steps, "timed steps, after one untimed")->check(cli::Range(1, 1000));
  app.add_option("--stage", o.stage, "ZeRO stage")->check(cli::Range(1, 3));
  app.add_option("--host-threads", o.host_threads, "threads of the host optimizer")->check(cli::Range(1, 1024));
  app.add_option("--dtype", o.dtype, "compute dtype")->check(cli::IsMember({"bf16", "fp32"}));
  app.add_option("--device", o.device, "host, or cuda:N");
  app.add_flag("--pin", o.pin, "pinned host memory (CUDA)");
  app.add_option("--nvme", o.nvme, "offload to a swap file in this directory too");
  app.add_option("--buffer-count", o.buffer_count, "the swap ring's buffers (--nvme)")->check(cli::Range(1, 64));
  usage = app.help();
  cli::parse(app, argc, argv);
  if (o.params < o.units) cli::usage_error("--params {} is fewer than --units {}", o.params, o.units);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  std::string usage;
  try {
    opt = parse(argc, argv, usage);
  } catch (const cli::UsageError& e) {
    return cli::usage_exit("offload_bench", e, usage);
  }
  try {
    fmt::print("offload_bench: P = {} parameters in {} units, stage {}, {} AdamW, 1 rank on {}, {} host thread(s){}, "
               "{} steps (median; {} build)\n",
               opt.params, opt.units, opt.stage, opt.dtype, opt.device, opt.host_threads,
               opt.pin ? ", pinned" : "", opt.steps, ZEST_BENCH_BUILD_TYPE);
    const Times base = run(opt, Mode::kNone);
    const Times off = run(opt, Mode::kCpu);
    const double sum = off.d2h + off.update + off.h2d;
    const double slowest = std::max({off.d2h, off.update, off.h2d});
    fmt::print("{:>10} {:>10} {:>10} | {:>11} {:>10} {:>10} | {:>8}\n", "d2h ms", "update ms", "h2d ms",
               "pipeline ms", "serial ms", "bound ms", "overlap");
    const std::string overlap =
        sum - slowest > 0 ? fmt::format("{:.0f}%", 100.0 * (sum - off.pipeline) / (sum - slowest)) : "n/a";
    fmt::print("{:10.2f} {:10.2f} {:10.2f} | {:11.2f} {:10.2f} {:10.2f} | {:>8}   (target >= 70%)\n", off.d2h,
               off.update, off.h2d, off.pipeline, sum, slowest, overlap);
    fmt::print("pipeline / bound (slowest stage): {:.2f}\n", off.pipeline / slowest);
    fmt::print("step ms: {:.2f} without offload (optimizer {:.2f}), {:.2f} with (optimizer {:.2f}): {:.2f}x\n",
               base.step, base.optimizer, off.step, off.optimizer, off.step / base.step);
    if (!opt.nvme.empty()) {
      const Times nvme = run(opt, Mode::kNvme);
      fmt::print("nvme ({}): d2h {:.2f}, update {:.2f}, h2d {:.2f}, pipeline {:.2f} ms; step ms "
                 "{:.2f}: {:.2f}x CPU offload's\n",
                 opt.nvme, nvme.d2h, nvme.update, nvme.h2d, nvme.pipeline, nvme.step, nvme.step / off.step);
      const double bytes = static_cast<double>(nvme.region_bytes);
      const double hidden = nvme.io + nvme.update - nvme.pipeline;
      const double shorter = std::min(nvme.io, nvme.update);
      const double bound = std::max(nvme.io, nvme.update);
      fmt::print("nvme I/O alone, between the steps ({:.1f} MB a region, records of {:.2f} MiB, {} buffers): read "
                 "{:.2f} ms ({:.2f} GB/s), write {:.2f} ms ({:.2f} GB/s), read + write as the step does (io) {:.2f} "
                 "ms\n",
                 bytes / 1e6, static_cast<double>(nvme.record_bytes) / 1048576.0, opt.buffer_count, nvme.read,
                 bytes / nvme.read / 1e6, nvme.write, bytes / nvme.write / 1e6, nvme.io);
      fmt::print("nvme step: io {:.2f} + update {:.2f} = {:.2f} ms serial, bound (longer) {:.2f} ms, pipeline {:.2f} "
                 "ms: overlap {:.0f}% (target >= 70%), pipeline / bound {:.2f}\n",
                 nvme.io, nvme.update, nvme.io + nvme.update, bound, nvme.pipeline,
                 shorter > 0 ? 100.0 * hidden / shorter : 0.0, nvme.pipeline / bound);
      fmt::print("nvme step, in the stream: blocked on reads {:.2f} ms, on writes {:.2f} ms, chunks (update and "
                 "hand-offs) {:.2f} ms, of which the drive was busy throughout {:.2f} ms: overlap in the stream "
                 "{:.0f}% (target >= 70%)\n",
                 nvme.read_wait, nvme.write_wait, nvme.chunk, nvme.chunk_overlapped,
                 nvme.chunk > 0 ? 100.0 * nvme.chunk_overlapped / nvme.chunk : 0.0);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "offload_bench: %s\n", e.what());
    return 1;
  }
}
