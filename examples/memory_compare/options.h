// Command-line options of memory_compare: which stages and world sizes to
// run, how long, in which dtype, and where the Markdown and SVG go.
#pragma once

#include <string>
#include <vector>

#include "cli/cli.h"
#include "mlp.h"
#include "zest/config/config.h"

namespace memory_compare {

using UsageError = cli::UsageError;

struct Options {
  mlp::Shape shape;
  std::vector<int> stages{0, 1, 2, 3};
  std::vector<int> worlds{1, 2, 4, 8};  // in-process ranks
  long steps = 3;                       // >= 2 so stage 3 prefetches (it records its order on step 1)
  int rows_per_rank = 8;                // micro-batch rows; memory does not depend on it
  std::string dtype = "bf16";           // fp32, bf16 or fp16
  unsigned seed = 1234;
  std::string markdown_path = "memory_compare.md";
  std::string svg_path = "memory_compare.svg";
  zest::CommOptions comm;  // --timeout SECONDS (else ZEST_COMM_TIMEOUT, else 10 min)
};

std::string usage();
// Throws UsageError naming the bad argument; "help" for --help.
Options parse_options(int argc, char** argv);

// The examples' default configuration (common/default_config.h) at
// `stage`, in opt.dtype.
zest::EngineConfig engine_config(const Options& opt, int stage);

}  // namespace memory_compare
