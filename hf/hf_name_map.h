// How a Hugging Face checkpoint's tensor names become the engine's parameter
// names, and back on export. The default maps every name to itself: a model
// registered with LlamaForCausalLM's names ("model.layers.0.mlp.up_proj.weight",
// "lm_head.weight") needs nothing more.
//
//   // zest-example
//   zest::HfNameMap names;
//   names.checkpoint_prefix = "base_model.model.";     // stripped on import ...
//   names.engine_prefix = "";                          // ... and nothing added
//   names.table["lm_head.weight"] = "output.weight";   // one name of its own
//   std::string e = names.engine_name("base_model.model.model.norm.weight");  // "model.norm.weight"
//
// A name in `table` maps to its entry; otherwise a name starting with
// checkpoint_prefix has it replaced by engine_prefix; otherwise it is kept.
// checkpoint_name() undoes engine_name() the same way (the table inverted,
// then engine_prefix back to checkpoint_prefix). Import and export check
// that the two agree on every name they map, and refuse a map under which
// two names become one.
#pragma once

#include <map>
#include <string>

namespace zest {

struct HfNameMap {
  std::map<std::string, std::string> table;  // checkpoint name -> engine name
  std::string checkpoint_prefix;
  std::string engine_prefix;

  std::string engine_name(const std::string& checkpoint_name) const;
  std::string checkpoint_name(const std::string& engine_name) const;
};

}  // namespace zest
