// Trains the MLP of mlp.h on the teacher task of task.h through the ZeRO
// engine, printing loss, step time and memory per rank.
//
//   mlp --ranks 4 --stage 2                 4 in-process ranks (threads)
//   mlp --ranks 4 --stages 0,1,2,3          each stage in turn, then a table of
//                                           final loss and memory against the
//                                           ZeRO formula
//   mpirun -np 4 mlp --launch --stage 3     one process per rank (MPI)
//   mlp --stages 0,1,2,3 --digest           a digest of the trained weights per
//                                           stage (equal runs, equal digests)
//   mlp --config ds_config.json             a DeepSpeed configuration
//   mlp --comm-report                       the bytes and seconds of communication
//                                           after the first step (common/comm_report.h)
//   mlp --stage 2 --offload nvme --nvme-path /tmp --host-memory 64
//                                           the master weights and optimizer
//                                           state in a swap file per rank, a
//                                           host of 64 MiB per rank (its
//                                           allocator's capacity, as a smaller
//                                           host would be); --offload cpu there
//                                           stops at the allocator's
//                                           out-of-memory error
//   mlp --device cuda --ranks 4 --dtype bf16
//                                           4 in-process ranks sharing cuda:0,
//                                           forward and backward with cuBLAS
//                                           (mlp_cuda.h)
//
// One process per GPU, NCCL on cuda:(local rank), through
// zest::init_distributed (launch/bootstrap.h: how the ranks find each other):
//
//   torchrun --nproc_per_node 8 --no-python ./mlp --launch --device cuda
//   mpirun -np 8 ./mlp --launch --device cuda
//
// The global batch of a step is the same whatever the number of ranks; each
// rank takes its rows of it, split again into accumulation micro-batches.
#include <chrono>
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "mlp_cuda.h"
#include "common/comm_report.h"
#include "common/weights_digest.h"
#include "options.h"
#include "report.h"
#include "task.h"
#include "zest/launch/bootstrap.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/comm/mpi_comm.h"
#include "zest/core/check.h"
#include "zest/core/units.h"
#include "zest/checkpoint/checkpoint.h"
#include "zest/memory/raw_allocator.h"

namespace {

using Clock = std::chrono::steady_clock;

// One rank's training run; returns what the summary table needs.
mlp::RunSummary train(const mlp::Options& opt, const zest::EngineConfig& config, zest::Communicator& comm) {
  // Everything on the communicator's device: the host, cuda:N for in-process
  // ranks (all on one GPU, a stream each), cuda:(local rank) under a launcher.
  const zest::Device device = comm.device();
  zest::CachingAllocator allocator(device.is_cuda() ? zest::make_cuda_allocator(device.index())
                                                    : zest::make_host_allocator());
  const zest::OwnedStream stream(device);  // this rank's compute stream
  // The offloaded state's host memory: the engine's own, or with
  // --host-memory an allocator of that capacity (pinned on a GPU).
  std::unique_ptr<zest::CachingAllocator> host;
  if (opt.host_memory_mib > 0) {
    std::unique_ptr<zest::RawAllocator> raw =
        device.is_cuda() ? zest::make_cuda_pinned_allocator() : zest::make_host_allocator();
    host = std::make_unique<zest::CachingAllocator>(
        zest::make_limited_allocator(std::move(raw), static_cast<size_t>(opt.host_memory_mib) << 20));
  }
  const std::unique_ptr<zest::Engine> owned = host ? std::make_unique<zest::Engine>(config, comm, allocator, *host, stream)
                                                  : std::make_unique<zest::Engine>(config, comm, allocator, stream);
  zest::Engine& engine = *owned;
  // cuBLAS and scratch memory for the device path; nothing on the host.
  mlp::DeviceContext device_context(allocator, stream);
  mlp::register_layers(engine, opt.shape);
  engine.finalize([&](const zest::ParamLayout& p, std::span<float> v) { mlp::init_parameter(p, v, opt.seed); });

  const mlp::Teacher teacher(opt.shape, opt.seed + 1);
  const int world = comm.size();
  const int accum = static_cast<int>(engine.config().accumulation_steps());  // as the engine resolved it
  const int rows_per_rank = opt.batch / world;
  const int rows_per_micro = rows_per_rank / accum;
  const mlp::Batch held_out = teacher.batch(-1, 0, 256);
  // Resuming continues the step count, so the data follows on too.
  long first = 0;
  if (!opt.load_dir.empty()) {
    zest::load_checkpoint(engine, opt.load_dir);
    first = static_cast<long>(engine.progress().applied_steps + engine.progress().skipped_steps);
    if (comm.rank() == 0) fmt::print("resumed from {} at step {}\n", opt.load_dir, first);
  }

  mlp::RunSummary summary;
  examples::CommMeter meter(engine);
  for (long step = first; step < first + opt.steps; ++step) {
    const auto start = Clock::now();
    float loss = 0.0f;
    zest::StepResult result;
    for (int m = 0; m < accum; ++m) {
      const mlp::Batch batch = teacher.batch(step, comm.rank() * rows_per_rank + m * rows_per_micro, rows_per_micro);
      loss += mlp::forward_backward(engine, opt.shape, batch, &device_context) / static_cast<float>(accum);
      result = engine.step();
      meter.add(result);
    }
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    // The same decision on every rank: gather_step is collective.
    if (step % opt.print_every == 0 || step == first + opt.steps - 1) {
      const std::vector<mlp::RankStep> ranks = mlp::gather_step(engine, loss);
      if (comm.rank() == 0) mlp::print_step(step, ranks, result, ms);
    }
  }
  if (!opt.save_dir.empty()) {
    const std::string dir = zest::save_checkpoint(engine, opt.save_dir);
    if (comm.rank() == 0) fmt::print("saved {}\n", dir);
  }
  if (opt.comm_report) {
    const std::string report = meter.format();
    if (comm.rank() == 0) fmt::print("{}\n", report);
  }
  if (opt.digest) {
    const std::string digest = examples::format_weights_digest(engine, config.zero.stage);
    if (comm.rank() == 0) fmt::print("{}\n", digest);
  }
  summary.final_loss = mlp::evaluate(engine, opt.shape, held_out, &device_context);
  summary.memory = engine.memory_report();
  if (comm.rank() == 0 && config.offload_optimizer.device != zest::OffloadDevice::kNone) {
    const zest::MemoryReport& m = summary.memory;
    fmt::print("rank 0 host: peak {} of {} (the allocator's), model states {}, swap ring {}; NVMe {}\n",
               zest::format_bytes(m.host_peak_reserved),
               opt.host_memory_mib > 0 ? zest::format_bytes(opt.host_memory_mib << 20) : std::string("no limit"),
               zest::format_bytes(m.host_model_states()), zest::format_bytes(m.host_swap_buffers),
               zest::format_bytes(m.nvme_bytes()));
  }
  return summary;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const mlp::Options opt = mlp::parse_options(argc, argv);
    // Under a launcher (mpirun, torchrun) this process is one rank of the
    // job (NCCL on cuda:(local rank) for --device cuda, whatever its index);
    // otherwise the ranks are threads of this process, all on opt.device.
    std::unique_ptr<zest::Communicator> launched;
    if (opt.launch) launched = zest::init_distributed(opt.device, opt.comm);
    const bool printer = !launched || launched->rank() == 0;

    std::vector<mlp::StageRow> rows;
    for (int stage : opt.stages) {
      const zest::EngineConfig config = mlp::engine_config(opt, stage);
      const int world = launched ? launched->size() : opt.ranks;
      if (printer) {
        fmt::print("== stage {}: {} ranks on {}, {} parameters, {}, {} ==\n", stage, world,
                   (launched ? launched->device() : opt.device).str(), opt.shape.parameters(),
                   zest::dtype_name(config.compute_dtype()), zest::optimizer_name(config.optimizer.kind));
        std::fflush(stdout);
      }
      mlp::RunSummary rank0;
      const auto body = [&](zest::Communicator& comm) {
        mlp::RunSummary s = train(opt, config, comm);
        if (comm.rank() == 0) rank0 = std::move(s);
      };
      if (launched) {
        body(*launched);
      } else {
        zest::run_inprocess(opt.ranks, body, opt.device, opt.comm);
      }
      rows.push_back({stage, world, rank0, config.zero.shard_group_size(world)});
    }
    if (printer && (rows.size() > 1 || opt.table)) {
      fmt::print("\n{}", mlp::format_stage_table(rows, opt.shape.parameters(), mlp::engine_config(opt, 0)));
    }
    return 0;
  } catch (const mlp::UsageError& e) {
    return cli::usage_exit("mlp", e, mlp::usage());
  } catch (const std::exception& e) {
    // Under mpirun the other ranks would wait for this one until their
    // collectives time out, and MPI_Finalize here for them: end the job.
    zest::MpiEnvironment::abort_job(fmt::format("mlp: {}", e.what()));
  }
}
