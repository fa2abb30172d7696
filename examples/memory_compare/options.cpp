#include "options.h"

#include <string_view>

#include "common/default_config.h"

namespace memory_compare {
using cli::number;
using cli::number_list;

std::string usage() {
  return "usage: memory_compare [--stages 0,1,2,3] [--worlds 1,2,4,8] [--steps N] [--dtype fp32|bf16|fp16]\n"
         "                      [--hidden N] [--layers N] [--rows N] [--seed N]\n"
         "                      [--markdown FILE] [--svg FILE]\n"
         "Trains the example MLP on in-process ranks under each ZeRO stage and world size, and\n"
         "compares each rank's memory by category with zest::estimate_memory. Exits 1 when a\n"
         "model-state category differs from the estimate or ranks disagree.\n";
}

Options parse_options(int argc, char** argv) {
  Options o;
  cli::for_each_flag(argc, argv, {}, [&](std::string_view flag, std::string_view v) {
    if (flag == "--stages") o.stages = number_list(flag, v, 0, 3);
    else if (flag == "--worlds") o.worlds = number_list(flag, v, 1, 64);
    else if (flag == "--steps") o.steps = number<long>(flag, v, 1, 1'000'000);
    else if (flag == "--hidden") o.shape.hidden = number<int>(flag, v, 1, 1 << 14);
    else if (flag == "--layers") o.shape.layers = number<int>(flag, v, 1, 1024);
    else if (flag == "--rows") o.rows_per_rank = number<int>(flag, v, 1, 1 << 16);
    else if (flag == "--seed") o.seed = number<unsigned>(flag, v, 0, ~0u);
    else if (flag == "--markdown") o.markdown_path = v;
    else if (flag == "--svg") o.svg_path = v;
    else if (flag == "--dtype") o.dtype = examples::dtype_flag(flag, v);
    else cli::usage_error("unknown option {}", flag);
  });
  return o;
}

zest::EngineConfig engine_config(const Options& opt, int stage) {
  zest::EngineConfig c = examples::default_engine_config(3e-3f);
  c.zero.stage = stage;
  examples::set_compute_dtype(c, opt.dtype);
  return c;
}

}  // namespace memory_compare
