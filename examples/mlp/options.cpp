#include "options.h"

#include <string_view>

#include <fmt/format.h>

#include "common/default_config.h"
#include "zest/core/check.h"
#include "zest/core/device.h"

namespace mlp {
using cli::number;
using cli::number_list;

namespace {

// zest::parse_device, with its refusal (an unknown name, or a GPU this build
// or machine does not have) as a usage error.
zest::Device device(std::string_view flag, std::string_view v) {
  try {
    return zest::parse_device(v);
  } catch (const zest::Error& e) {
    throw UsageError(fmt::format("{} {}: {}", flag, v, e.message()));
  }
}

}  // namespace

std::string usage() {
  return "usage: mlp [--ranks N] [--stage S | --stages 0,1,2,3] [--dtype fp32|bf16|fp16]\n"
         "           [--steps N] [--batch ROWS] [--accum N] [--lr X] [--layers N] [--hidden N]\n"
         "           [--seed N] [--config ds_config.json] [--launch] [--device host|cuda[:N]]\n"
         "           [--print-every N] [--table] [--save CKPT_ROOT] [--load CKPT_ROOT]\n";
}

Options parse_options(int argc, char** argv) {
  Options o;
  cli::for_each_flag(argc, argv, {"--launch", "--table"}, [&](std::string_view flag, std::string_view v) {
    if (flag == "--launch") o.launch = true;
    else if (flag == "--table") o.table = true;
    else if (flag == "--ranks") o.ranks = number<int>(flag, v, 1, 1 << 20);
    else if (flag == "--stage") o.stages = {number<int>(flag, v, 0, 3)};
    else if (flag == "--stages") o.stages = number_list(flag, v, 0, 3);
    else if (flag == "--dtype") o.dtype = examples::dtype_flag(flag, v);
    else if (flag == "--steps") o.steps = number<long>(flag, v, 0, 1L << 40);
    else if (flag == "--batch") o.batch = number<int>(flag, v, 1, 1 << 20);
    else if (flag == "--accum") o.accum = number<int>(flag, v, 1, 1 << 20);
    else if (flag == "--lr") o.lr = std::stof(std::string(v));
    else if (flag == "--layers") o.shape.layers = number<int>(flag, v, 1, 1 << 20);
    else if (flag == "--hidden") o.shape.hidden = number<int>(flag, v, 1, 1 << 20);
    else if (flag == "--seed") o.seed = number<unsigned>(flag, v, 0, ~0u);
    else if (flag == "--config") o.config_path = v;
    else if (flag == "--device") o.device = device(flag, v);
    else if (flag == "--print-every") o.print_every = number<long>(flag, v, 1, 1L << 40);
    else if (flag == "--save") o.save_dir = v;
    else if (flag == "--load") o.load_dir = v;
    else cli::usage_error("unknown option {}", flag);
  });
  return o;
}

zest::EngineConfig engine_config(const Options& opt, int stage) {
  zest::EngineConfig c = opt.config_path.empty() ? examples::default_engine_config(opt.lr)
                                                  : zest::load_config_file(opt.config_path);
  c.zero.stage = stage;
  if (opt.accum > 0) c.gradient_accumulation_steps = opt.accum;
  if (!opt.dtype.empty()) examples::set_compute_dtype(c, opt.dtype);
  const int world = opt.launch ? 0 : opt.ranks;
  if (world > 0 && opt.batch % (world * c.gradient_accumulation_steps) != 0) {
    throw UsageError(fmt::format("--batch {} does not divide into {} ranks x {} micro-steps", opt.batch,
                                 world, c.gradient_accumulation_steps));
  }
  return c;
}

}  // namespace mlp
