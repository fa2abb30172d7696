#include "options.h"

#include <string_view>

#include <fmt/format.h>

#include "zest/core/check.h"
#include "zest/core/device.h"

namespace mlp {
using examples::number;
using examples::number_list;

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
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--launch") { o.launch = true; continue; }
    if (flag == "--table") { o.table = true; continue; }
    if (flag == "--help" || flag == "-h") throw UsageError("help");
    if (i + 1 >= argc) throw UsageError(fmt::format("{} needs a value", flag));
    const std::string_view v = argv[++i];
    if (flag == "--ranks") o.ranks = number<int>(flag, v, 1, 1 << 20);
    else if (flag == "--stage") o.stages = {number<int>(flag, v, 0, 3)};
    else if (flag == "--stages") o.stages = number_list(flag, v, 0, 3);
    else if (flag == "--dtype") o.dtype = v;
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
    else throw UsageError(fmt::format("unknown option {}", flag));
  }
  if (!o.dtype.empty() && o.dtype != "fp32" && o.dtype != "bf16" && o.dtype != "fp16") {
    throw UsageError(fmt::format("--dtype {}: expected fp32, bf16 or fp16", o.dtype));
  }
  return o;
}

zest::EngineConfig engine_config(const Options& opt, int stage) {
  zest::EngineConfig c;
  if (!opt.config_path.empty()) {
    c = zest::load_config_file(opt.config_path);
  } else {
    c.optimizer.kind = zest::OptimizerKind::kAdamW;
    c.optimizer.lr = opt.lr;
    c.optimizer.weight_decay = 0.01f;
    c.gradient_clipping = 1.0;
    // The example's layers (65k parameters) are under DeepSpeed's default
    // threshold of 1e5, which would keep them all whole at stage 3.
    c.zero.stage3_param_persistence_threshold = 0;
  }
  c.zero.stage = stage;
  if (opt.accum > 0) c.gradient_accumulation_steps = opt.accum;
  if (!opt.dtype.empty()) {
    c.bf16 = opt.dtype == "bf16";
    c.fp16.enabled = opt.dtype == "fp16";
  }
  const int world = opt.launch ? 0 : opt.ranks;
  if (world > 0 && opt.batch % (world * c.gradient_accumulation_steps) != 0) {
    throw UsageError(fmt::format("--batch {} does not divide into {} ranks x {} micro-steps", opt.batch,
                                 world, c.gradient_accumulation_steps));
  }
  return c;
}

zest::DType compute_dtype(const zest::EngineConfig& config) {
  if (config.fp16.enabled) return zest::DType::kFloat16;
  if (config.bf16) return zest::DType::kBFloat16;
  return zest::DType::kFloat32;
}

}  // namespace mlp
