#include "options.h"

#include <string_view>

#include "common/default_config.h"

namespace memory_compare {

std::string usage() {
  return "usage: memory_compare [--stages 0,1,2,3] [--worlds 1,2,4,8] [--steps N] [--dtype fp32|bf16|fp16]\n"
         "                      [--hidden N] [--layers N] [--rows N] [--seed N]\n"
         "                      [--markdown FILE] [--svg FILE] [--timeout SECONDS]\n"
         "Trains the example MLP on in-process ranks under each ZeRO stage and world size, and\n"
         "compares each rank's memory by category with zest::estimate_memory. Exits 1 when a\n"
         "model-state category differs from the estimate or ranks disagree.\n";
}

Options parse_options(int argc, char** argv) {
  Options o;
  cli::App app("memory_compare");
  app.add_option("--stages", o.stages)->delimiter(',')->check(cli::Range(0, 3));
  app.add_option("--worlds", o.worlds)->delimiter(',')->check(cli::Range(1, 64));
  app.add_option("--steps", o.steps)->check(cli::Range(1L, 1'000'000L));
  app.add_option("--hidden", o.shape.hidden)->check(cli::Range(1, 1 << 14));
  app.add_option("--layers", o.shape.layers)->check(cli::Range(1, 1024));
  app.add_option("--rows", o.rows_per_rank)->check(cli::Range(1, 1 << 16));
  app.add_option("--seed", o.seed)->check(cli::Range(0u, ~0u));
  app.add_option("--markdown", o.markdown_path);
  app.add_option("--svg", o.svg_path);
  cli::add_timeout(app, o.comm);
  app.add_option("--dtype", o.dtype);  // checked below, with the examples' message
  cli::parse(app, argc, argv);
  if (app.count("--dtype") > 0) o.dtype = examples::dtype_flag("--dtype", o.dtype);
  return o;
}

zest::EngineConfig engine_config(const Options& opt, int stage) {
  zest::EngineConfig c = examples::default_engine_config(3e-3f);
  c.zero.stage = stage;
  examples::set_compute_dtype(c, opt.dtype);
  return c;
}

}  // namespace memory_compare
