// Checkpoints of an offloading engine, to host memory or to NVMe (the
// optimizer, and at stage 3 the parameters too), are those
// of one that does not offload: saved by either, loaded by either, training
// resumes with the bits of a run that never stopped.
#include <doctest/doctest.h>

#include <filesystem>

#include "checkpoint/temp_dir.h"
#include "engine/engine_harness.h"
#include "zest/checkpoint/checkpoint.h"
#include "zest/core/file_io.h"

using namespace zest;
using namespace zest::test;
namespace fs = std::filesystem;

namespace {

// Steps [first, last) on `world` ranks, loading `load_from` first and saving
// to `save_to` last when given; rank 0's parameters.
Params run(const EngineConfig& config, int world, int64_t first, int64_t last, const std::string& load_from = "",
           const std::string& save_to = "") {
  std::vector<Params> out(static_cast<size_t>(world));
  run_inprocess(world, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    CachingAllocator host(make_host_allocator());
    const std::unique_ptr<Engine> engine =
        finalized_engine(config, comm, alloc, host, Stream::default_for(Device::host()));
    if (!load_from.empty()) load_checkpoint(*engine, load_from);
    RankResult r;
    run_steps(*engine, comm, runs(world, 0), first, last, r);
    if (!save_to.empty()) save_checkpoint(*engine, save_to);
    out[static_cast<size_t>(comm.rank())] = master_params(*engine);
  });
  return out[0];
}

}  // namespace

TEST_CASE("checkpoints with and without offload are the same files, and resume each other bit for bit") {
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    EngineConfig plain = base_config(stage);
    plain.bf16 = true;
    plain.gradient_clipping = 0.5;
    EngineConfig off = plain;
    off.offload_optimizer.device = OffloadDevice::kCpu;
    EngineConfig half = off;
    half.offload_optimizer.ratio = 0.5;
    // At stage 3 the parameter shards offloaded too.
    EngineConfig all = off;
    if (stage == 3) all.offload_param.device = OffloadDevice::kCpu;
    // The state in a swap file: all of it, and half.
    TempDir swap;
    EngineConfig nvme = off;
    nvme.offload_optimizer.device = OffloadDevice::kNvme;
    nvme.offload_optimizer.nvme_path = swap.str();
    nvme.offload_optimizer.buffer_count = 2;
    EngineConfig nvme_half = nvme;
    nvme_half.offload_optimizer.ratio = 0.5;
    // At stage 3 the parameter shards in a swap file too (all of them).
    EngineConfig nvme_all = nvme;
    if (stage == 3) {
      nvme_all.offload_param.device = OffloadDevice::kNvme;
      nvme_all.offload_param.nvme_path = swap.str();
      nvme_all.offload_param.buffer_count = 2;
      nvme_all.offload_param.max_in_cpu = 0;
    }
    const int world = 2;
    const Params straight = run(plain, world, 0, 4);

    TempDir a, b, c, d, e, f, g;
    run(plain, world, 0, 2, "", a.str());
    run(off, world, 0, 2, "", b.str());
    run(half, world, 0, 2, "", c.str());
    run(all, world, 0, 2, "", d.str());
    run(nvme, world, 0, 2, "", e.str());
    run(nvme_half, world, 0, 2, "", f.str());
    run(nvme_all, world, 0, 2, "", g.str());
    // The shard files hold the same bytes, wherever the state lived.
    for (const char* file : {"rank_00000.bin", "rank_00001.bin"}) {
      CAPTURE(file);
      const std::string want = read_text_file((a.path / "step_000002" / file).string());
      CHECK(read_text_file((b.path / "step_000002" / file).string()) == want);
      CHECK(read_text_file((c.path / "step_000002" / file).string()) == want);
      CHECK(read_text_file((d.path / "step_000002" / file).string()) == want);
      CHECK(read_text_file((e.path / "step_000002" / file).string()) == want);
      CHECK(read_text_file((f.path / "step_000002" / file).string()) == want);
      CHECK(read_text_file((g.path / "step_000002" / file).string()) == want);
    }
    // Either loads into either, and training goes on as if it never stopped.
    check_same(run(off, world, 2, 4, a.str()), straight);
    check_same(run(plain, world, 2, 4, b.str()), straight);
    check_same(run(half, world, 2, 4, b.str()), straight);
    check_same(run(off, world, 2, 4, c.str()), straight);
    check_same(run(all, world, 2, 4, a.str()), straight);
    check_same(run(plain, world, 2, 4, d.str()), straight);
    check_same(run(nvme, world, 2, 4, b.str()), straight);
    check_same(run(off, world, 2, 4, e.str()), straight);
    check_same(run(nvme_half, world, 2, 4, e.str()), straight);
    check_same(run(nvme, world, 2, 4, f.str()), straight);
    check_same(run(nvme_all, world, 2, 4, a.str()), straight);
    check_same(run(plain, world, 2, 4, g.str()), straight);
  }
}
