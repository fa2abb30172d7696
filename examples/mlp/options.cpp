#include "options.h"

#include <string_view>

#include <fmt/format.h>

#include "common/default_config.h"
#include "zest/launch/launch_env.h"

namespace mlp {

std::string usage() {
  return "usage: mlp [--ranks N] [--stage S | --stages 0,1,2,3] [--dtype fp32|bf16|fp16]\n"
         "           [--steps N] [--batch ROWS] [--accum N] [--lr X] [--layers N] [--hidden N]\n"
         "           [--seed N] [--config ds_config.json] [--launch] [--device host|cuda[:N]]\n"
         "           [--print-every N] [--table] [--save CKPT_ROOT] [--load CKPT_ROOT]\n"
         "           [--timeout SECONDS] [--digest] [--comm-report]\n"
         "           [--offload cpu|nvme] [--nvme-path DIR] [--host-memory MIB]\n";
}

Options parse_options(int argc, char** argv) {
  Options o;
  cli::App app("mlp");
  int stage = -1;
  std::vector<int> stages;
  std::string device_name;
  app.add_flag("--launch", o.launch);
  cli::add_timeout(app, o.comm);
  app.add_flag("--table", o.table);
  app.add_flag("--digest", o.digest);
  app.add_flag("--comm-report", o.comm_report);
  app.add_option("--ranks", o.ranks)->check(cli::Range(1, 1 << 20));
  cli::Option* one = app.add_option("--stage", stage)->check(cli::Range(0, 3));
  app.add_option("--stages", stages)->delimiter(',')->check(cli::Range(0, 3))->excludes(one);
  app.add_option("--dtype", o.dtype);  // checked below, with the examples' message
  app.add_option("--steps", o.steps)->check(cli::Range(0L, 1L << 40));
  app.add_option("--batch", o.batch)->check(cli::Range(1, 1 << 20));
  app.add_option("--accum", o.accum)->check(cli::Range(1, 1 << 20));
  app.add_option("--lr", o.lr)->check(cli::real_range(0, 1e6));
  app.add_option("--layers", o.shape.layers)->check(cli::Range(1, 1 << 20));
  app.add_option("--hidden", o.shape.hidden)->check(cli::Range(1, 1 << 20));
  app.add_option("--seed", o.seed)->check(cli::Range(0u, ~0u));
  app.add_option("--config", o.config_path);
  app.add_option("--device", device_name);
  app.add_option("--print-every", o.print_every)->check(cli::Range(1L, 1L << 40));
  app.add_option("--save", o.save_dir);
  app.add_option("--load", o.load_dir);
  app.add_option("--offload", o.offload)->check(cli::IsMember({"cpu", "nvme"}));
  app.add_option("--nvme-path", o.nvme_path);
  app.add_option("--host-memory", o.host_memory_mib)->check(cli::Range(1L, 1L << 30));
  cli::parse(app, argc, argv);
  if (o.offload == "nvme" && o.nvme_path.empty()) {
    throw UsageError("--offload nvme needs --nvme-path DIR: the directory of the swap files (it must exist)");
  }
  if (!o.nvme_path.empty() && o.offload != "nvme") {
    throw UsageError("--nvme-path is the swap files' directory of --offload nvme; give --offload nvme too");
  }
  if (app.count("--dtype") > 0) o.dtype = examples::dtype_flag("--dtype", o.dtype);
  if (stage >= 0) o.stages = {stage};
  if (!stages.empty()) o.stages = stages;
  if (!device_name.empty()) o.device = cli::device_flag("--device", device_name);
  return o;
}

zest::EngineConfig engine_config(const Options& opt, int stage) {
  zest::EngineConfig c = examples::default_engine_config(opt.lr);
  if (!opt.config_path.empty()) {
    // The example's own optimizer and schedule, for a file without those
    // sections (DeepSpeed steps the program's then).
    zest::AutoValues program;
    program.optimizer = c.optimizer;
    program.scheduler = c.scheduler;
    // "auto" MiCS / hpZ groups: one host's ranks (all of them in-process).
    program.local_world_size = opt.launch ? zest::detect_launch_env().local_world_size : opt.ranks;
    c = zest::load_config_file(opt.config_path, program);
  }
  c.zero.stage = stage;
  if (stage != 3) {
    // A file's MiCS / hpZ groups are stage-3 settings (DeepSpeed reads them
    // only there): the other stages of --stages run flat.
    c.zero.mics_shard_size = -1;
    c.zero.zero_hpz_partition_size = 1;
  }
  if (!opt.offload.empty()) {
    if (stage == 0) throw UsageError("--offload needs --stage 1, 2 or 3: stage 0 shards no optimizer state to offload");
    c.offload_optimizer.device = opt.offload == "nvme" ? zest::OffloadDevice::kNvme : zest::OffloadDevice::kCpu;
    c.offload_optimizer.nvme_path = opt.nvme_path;
  }
  if (opt.accum > 0) c.gradient_accumulation_steps = opt.accum;
  if (!opt.dtype.empty()) examples::set_compute_dtype(c, opt.dtype);
  const int world = opt.launch ? 0 : opt.ranks;
  if (world > 0 && opt.batch % (world * c.accumulation_steps()) != 0) {
    throw UsageError(fmt::format("--batch {} does not divide into {} ranks x {} micro-steps", opt.batch,
                                 world, c.accumulation_steps()));
  }
  return c;
}

}  // namespace mlp
