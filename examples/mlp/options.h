// Command-line options of the mlp example, and the engine configuration
// they make.
#pragma once

#include <string>
#include <vector>

#include "cli/cli.h"
#include "mlp.h"
#include "zest/config/config.h"

namespace mlp {

using UsageError = cli::UsageError;

struct Options {
  Shape shape;
  int ranks = 4;              // in-process ranks (ignored with --launch)
  std::vector<int> stages{2};
  std::string dtype;          // empty: fp32, or what the config file says
  long steps = 100;
  int batch = 64;             // global rows per step
  int accum = 0;              // 0: 1, or what the config file says
  float lr = 3e-3f;
  unsigned seed = 1234;
  std::string config_path;    // a DeepSpeed JSON file
  bool launch = false;        // one process per rank, from the launcher
  zest::Device device;        // host, or cuda:N (all in-process ranks on it;
                              // with --launch, cuda:(local rank) whatever N)
  long print_every = 1;
  std::string save_dir;       // a checkpoint after the last step
  std::string load_dir;       // resume from this checkpoint root first
  bool table = false;         // the summary table even for one stage
  bool digest = false;        // print a digest of the trained weights per stage
  bool comm_report = false;   // rank 0's bytes per communicator and comm seconds (common/comm_report.h)
  zest::CommOptions comm;     // --timeout SECONDS (else ZEST_COMM_TIMEOUT, else 10 min)
  std::string offload;        // --offload cpu|nvme: offload_optimizer's device (empty: the config's)
  std::string nvme_path;      // --nvme-path DIR: the swap files' directory (--offload nvme)
  long host_memory_mib = 0;   // --host-memory MIB: the host allocator's capacity per rank (0: none)
};

std::string usage();
// Throws UsageError naming the bad argument.
Options parse_options(int argc, char** argv);

// The configuration of one run: the file's (or the example's defaults),
// with --stage, --dtype and --accum on top.
zest::EngineConfig engine_config(const Options& opt, int stage);

}  // namespace mlp
