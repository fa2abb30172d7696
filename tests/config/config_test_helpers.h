// What the config tests ask of a parse: its error, or a key's note.
#pragma once

#include <filesystem>
#include <string>

#include "zest/config/config.h"
#include "zest/core/check.h"

namespace zest::test {

// A program that passes its own optimizer (ZEST's default AdamW) and no
// schedule: what a file without those sections then runs with (Note [a
// file without an optimizer or scheduler]).
inline AutoValues own_optimizer() {
  AutoValues p;
  p.optimizer = OptimizerConfig{};
  p.scheduler = LrScheduleConfig{};
  return p;
}

// `text` parsed with own_optimizer()'s program.
inline EngineConfig parse(const std::string& text) { return parse_config_json(text, own_optimizer()); }

// The error parse_config_json throws for `text`, or "no error".
inline std::string error_of(const std::string& text, const AutoValues& program = own_optimizer()) {
  try {
    (void)parse_config_json(text, program);
  } catch (const Error& e) {
    return e.message();
  }
  return "no error";
}

// The reason noted for an ignored key, or "" when it was not ignored.
inline std::string ignored_reason(const EngineConfig& c, const std::string& key) {
  for (const ConfigNote& n : c.ignored)
    if (n.key == key) return n.text;
  return "";
}

#ifdef ZEST_SOURCE_DIR
// A real DeepSpeed file of tests/config/ds_configs (sources in SOURCES.md);
// for targets that define ZEST_SOURCE_DIR.
inline std::filesystem::path ds_config_path(const std::string& name) {
  return std::filesystem::path(ZEST_SOURCE_DIR) / "tests" / "config" / "ds_configs" / name;
}
#endif

// What a Trainer-like program fills those files' "auto" from.
inline AutoValues ds_config_program() {
  AutoValues p;
  p.micro_batch_size = 4;
  p.gradient_accumulation_steps = 2;
  p.compute_dtype = DType::kBFloat16;
  p.hidden_size = 1024;
  p.learning_rate = 2e-5;
  p.weight_decay = 0.0;
  p.beta1 = 0.9;
  p.beta2 = 0.999;
  p.eps = 1e-8;
  p.gradient_clipping = 1.0;
  p.warmup_steps = 100;
  p.total_steps = 1000;
  // A file without a scheduler section: a constant rate, as a program
  // passing no schedule to deepspeed.initialize gets.
  p.scheduler = LrScheduleConfig{};
  return p;
}

}  // namespace zest::test
