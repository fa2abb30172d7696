// libFuzzer target: any bytes as a DeepSpeed config file, read once with no
// program values and once with a full AutoValues (so that "auto" is filled
// both ways). A zest::Error is the expected answer to a bad file; a finding
// is anything else (another exception, a crash, a sanitizer report), or a
// config that parses but fails the checks the Engine makes of it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "zest/config/config.h"
#include "zest/core/check.h"

namespace {

zest::AutoValues full_program() {
  zest::AutoValues p;
  p.micro_batch_size = 4;
  p.gradient_accumulation_steps = 2;
  p.world_size = 2;
  p.compute_dtype = zest::DType::kBFloat16;
  p.hidden_size = 1024;
  p.learning_rate = 2e-5;
  p.weight_decay = 0.01;
  p.beta1 = 0.9;
  p.beta2 = 0.999;
  p.eps = 1e-8;
  p.gradient_clipping = 1.0;
  p.warmup_steps = 10;
  p.total_steps = 100;
  p.scheduler = zest::LrScheduleConfig{};  // a file without a scheduler section: a constant rate
  return p;
}

void check(const std::string& text, const zest::AutoValues& program) {
  zest::EngineConfig c;
  try {
    c = zest::parse_config_json(text, program);
  } catch (const zest::Error&) {
    return;
  }
  // What parsed passes the checks the Engine repeats at construction.
  (void)c.compute_dtype();
  c.optimizer.validate();
  c.scheduler.validate();
  for (int world : {1, 3}) {
    zest::EngineConfig b = c;
    try {
      b.resolve_batch(world);  // may refuse a triple: a zest::Error
    } catch (const zest::Error&) {
      continue;
    }
    if (b.accumulation_steps() < 1) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const zest::AutoValues program = full_program();
  const std::string text(reinterpret_cast<const char*>(data), size);
  check(text, {});
  check(text, program);
  return 0;
}
