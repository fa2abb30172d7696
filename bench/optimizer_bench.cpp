// Throughput of the fused optimizer update on a flat shard, against a copy
// of the same bytes measured in the same run.
//
// The update is memory-bound: AdamW with an fp32 master, m and v, a 16-bit
// gradient in and a 16-bit parameter out moves 28 bytes per parameter (4+4+4
// read and written, 2 read, 2 written; 32 with fp32 gradient and parameter).
// A device-to-device (or host) copy of that many bytes is the floor it can
// approach, so the ratio says how close the kernel comes to the memory
// system's speed (issue 13's target on the host: at most 1.3x, fp32 and
// bf16, 16M parameters, one thread).
//
// On the host, built with libtorch (CMake found Torch), it also times
// torch::optim::AdamW on one fp32 parameter of the same size, single
// threaded, against ZEST's update of the same bytes (fp32 gradient, the
// parameter updated in place, no 16-bit copy) in the same run, and prints
// how many times faster ZEST is (target: at least 3x).
//
//   optimizer_bench [--device host|cuda:N] [--numel N] [--iters N] [--dtype bf16|fp16|fp32]
//                   [--threads N]   (OptimizerConfig::host_threads; targets are for 1)
//
// ZEST_CPU_ISA=baseline|avx2|avx512 picks the host loops' instruction set
// (core/cpu_isa.h); the one used is printed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/cli.h"
#include "zest/core/check.h"
#include "zest/core/cpu_isa.h"
#include "zest/core/device.h"
#include "zest/core/stream.h"
#include "zest/memory/caching_allocator.h"
#include "zest/memory/copy.h"
#include "zest/memory/raw_allocator.h"
#include "zest/optim/optimizer.h"

#if ZEST_BENCH_WITH_TORCH
#include "optimizer_bench_torch.h"
#endif

namespace {

using Clock = std::chrono::steady_clock;

template <typename Fn>
double median_ms(const zest::Stream& stream, int iters, Fn&& fn) {
  std::vector<double> ms;
  fn();  // warm-up
  stream.synchronize();
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    fn();
    stream.synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string device_name = "host";
    size_t numel = size_t{1} << 24;
    int iters = 20;
    int threads = 1;
    std::string dtype_name = "bf16";  // of the gradient in and the parameter out
    cli::App app("optimizer_bench: the fused AdamW update against a copy of the same bytes");
    app.add_option("--device", device_name, "host or cuda:N");
    app.add_option("--numel", numel, "parameters")->check(cli::Range(size_t{1}, size_t{1} << 36));
    app.add_option("--iters", iters)->check(cli::Range(1, 1 << 20));
    app.add_option("--dtype", dtype_name)->check(cli::IsMember({"bf16", "fp16", "fp32"}));
    app.add_option("--threads", threads, "host loops' threads")->check(cli::Range(1, 1024));
    try {
      app.parse(argc, argv);
    } catch (const cli::UsageError& e) {
      return cli::usage_exit("optimizer_bench", e, app.help());  // the help, or the error naming the flag
    }
    const zest::Device device = zest::parse_device(device_name);
    const zest::DType dtype = zest::parse_dtype(dtype_name);
    zest::check_device_available(device);
    zest::CachingAllocator alloc(device.is_cuda() ? zest::make_cuda_allocator(device.index())
                                                  : zest::make_host_allocator());
    const zest::OwnedStream stream(device);
    const auto buffer = [&](size_t bytes) {
      zest::Buffer b = alloc.allocate_buffer(bytes, stream);
      zest::fill_zero(stream, b.data(), bytes);
      return b;
    };
    zest::Buffer master = buffer(numel * 4), m = buffer(numel * 4), v = buffer(numel * 4);
    const size_t width = zest::elem_size(dtype);
    zest::Buffer grad = buffer(numel * width), param = buffer(numel * width);
    const size_t bytes = (24 + 2 * width) * numel;
    zest::Buffer src = buffer(bytes / 2), dst = buffer(bytes / 2);

    zest::OptimizerConfig config;  // AdamW
    config.host_threads = threads;
    config.validate();
    zest::ShardBuffers shard;
    shard.master = master.as<float>();
    shard.state[0] = m.as<float>();
    shard.state[1] = v.as<float>();
    shard.grad = grad.data();
    shard.grad_dtype = dtype;
    shard.param_out = param.data();
    shard.param_dtype = dtype;
    shard.numel = numel;
    zest::StepScalars scalars;
    scalars.lr = 1e-3f;
    int64_t step = 0;

    const double adam = median_ms(stream, iters, [&] {
      scalars.step = ++step;
      zest::optimizer_step(stream, config, shard, scalars);
    });
    // The copy reads and writes bytes / 2 each: the same traffic.
    const double copy = median_ms(stream, iters, [&] { zest::copy_bytes(stream, dst.data(), src.data(), bytes / 2); });

    fmt::print("optimizer_bench ({} build) on {}{}: AdamW, fp32 master/m/v, {} grad in and param out, {} "
               "parameters, median of {}\n",
               ZEST_BENCH_BUILD_TYPE, device.str(),
               device.is_host() ? fmt::format(" ({} loops, {} thread{})", zest::cpu_isa_name(zest::host_isa()), threads,
                                                     threads == 1 ? "" : "s") : "",
               zest::dtype_name(dtype), numel, iters);
    fmt::print("{:<28} {:>10} {:>14} {:>10}\n", "", "ms", "params/s", "GB/s");
    fmt::print("{:<28} {:>10.3f} {:>14.3e} {:>10.1f}\n", "fused AdamW update", adam,
               static_cast<double>(numel) / (adam / 1e3), static_cast<double>(bytes) / (adam / 1e3) / 1e9);
    fmt::print("{:<28} {:>10.3f} {:>14} {:>10.1f}\n", "copy of the same bytes", copy, "",
               static_cast<double>(bytes) / (copy / 1e3) / 1e9);
    fmt::print("ratio: the update takes {:.2f}x the copy's time (target <= 1.3x on the host)\n", adam / copy);
#if ZEST_BENCH_WITH_TORCH
    if (device.is_host()) {
      // The update torch does: fp32 gradient, the fp32 parameter in place.
      zest::Buffer grad32 = buffer(numel * 4);
      shard.grad = grad32.data();
      shard.grad_dtype = zest::DType::kFloat32;
      shard.param_out = nullptr;
      const double zest_fp32 = median_ms(stream, iters, [&] {
        scalars.step = ++step;
        zest::optimizer_step(stream, config, shard, scalars);
      });
      const double torch_ms = zest_bench::torch_adamw_ms(numel, iters, 1);
      fmt::print("{:<28} {:>10.3f}   (fp32 gradient, parameter in place)\n", "ZEST AdamW, torch's bytes", zest_fp32);
      fmt::print("{:<28} {:>10.3f}   (libtorch {}, 1 thread)\n", "torch::optim::AdamW", torch_ms,
                 ZEST_BENCH_TORCH_VERSION);
      fmt::print("ratio: ZEST is {:.2f}x faster than torch::optim::AdamW (target >= 3x)\n", torch_ms / zest_fp32);
    }
#endif
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "optimizer_bench: %s\n", e.what());
    return 1;
  }
}
