// Building the modules a TorchModule trains: reproducibly when ranks are
// threads of one process, and without any rank holding the whole model.
//
// Reproducible construction. libtorch's modules draw their initial values
// from torch's one global generator, which the in-process ranks (threads,
// zest::run_inprocess) share: two ranks seeding it and building at once
// interleave their draws, so the model differs from run to run even though
// TorchModule then broadcasts rank 0's values. make_module builds one module
// at a time in the process, from a seeded generator (seed 0 unless given);
// make_module_on(comm, ...) also keeps every rank's thread from drawing
// while any rank builds (the ranks meet before, build in rank order, and
// meet after), which is what in-process ranks need:
//
//   // zest-example: prelude=torch_module_construction
//   auto net = zest::make_module_on<Net>(engine.comm());     // the same bits on every run
//   auto other = zest::make_module<Net>(zest::ModuleSeed{7});  // one thread building
//
// Deferred construction (Note [deferred construction] in detail/deferred_values.h).
// A model too large for one rank is built a unit at a time: each unit's
// module is constructed, then made a placeholder (every parameter keeps its
// name, shape and dtype and gives back its memory), so the skeleton of the
// whole model never holds more than one unit's values. TorchModule then
// takes each placeholder unit's initial values from
// TorchModuleOptions::build_unit, one unit at a time on the initializing
// rank, or leaves them for a weights import (import_hf, a weights-only
// load) when TorchModuleOptions::placeholders_loaded_later is set:
//
//   // zest-example: prelude=torch_module_construction
//   auto model = std::make_shared<torch::nn::Module>();
//   auto blocks = model->register_module("blocks", torch::nn::ModuleList());
//   for (uint64_t i = 0; i < 4; ++i) blocks->push_back(zest::placeholder(zest::make_module<Net>(zest::ModuleSeed{i})));
//   zest::TorchModuleOptions o;
//   for (const auto& b : *blocks) o.units.push_back(b);
//   o.build_unit = [](const std::string& path) {             // "blocks.2": that block's values
//     return zest::make_module<Net>(zest::ModuleSeed{std::stoull(path.substr(path.rfind('.') + 1))});
//   };
//   zest::TorchModule zt(engine, model, o);
//
// A placeholder's parameters have no memory to read: a module must not run
// until TorchModule has pointed them at the engine's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <tuple>
#include <string>
#include <type_traits>
#include <utility>

#include <torch/torch.h>

#include "zest/comm/communicator.h"
#include "zest/core/stream.h"

namespace zest {

struct ModuleSeed {
  uint64_t value = 0;
};

// The lock every make_module holds while it builds: one construction at a
// time in the process, so each draws from torch's generator undisturbed by
// another rank's.
std::mutex& module_construction_mutex();

template <typename M, typename... Args>
std::shared_ptr<M> make_module(ModuleSeed seed, Args&&... args) {
  const std::lock_guard<std::mutex> lock(module_construction_mutex());
  torch::manual_seed(seed.value);
  return std::make_shared<M>(std::forward<Args>(args)...);
}

template <typename M, typename... Args>
  requires(sizeof...(Args) == 0 || !std::is_same_v<std::remove_cvref_t<std::tuple_element_t<0, std::tuple<Args...>>>, ModuleSeed>)
std::shared_ptr<M> make_module(Args&&... args) {
  return make_module<M>(ModuleSeed{}, std::forward<Args>(args)...);
}

// Collective: every rank of `comm` builds M(args...) from `seed`, in rank
// order, none of their threads drawing from torch's generator meanwhile.
template <typename M, typename... Args>
std::shared_ptr<M> make_module_on(Communicator& comm, ModuleSeed seed, Args&&... args) {
  const Stream stream = Stream::default_for(comm.device());
  comm.barrier(stream);  // every rank is here: none draws until the last build is done
  std::shared_ptr<M> out;
  for (int r = 0; r < comm.size(); ++r) {
    if (r == comm.rank()) out = make_module<M>(seed, std::forward<Args>(args)...);
    comm.barrier(stream);
  }
  return out;
}

template <typename M, typename... Args>
  requires(sizeof...(Args) == 0 || !std::is_same_v<std::remove_cvref_t<std::tuple_element_t<0, std::tuple<Args...>>>, ModuleSeed>)
std::shared_ptr<M> make_module_on(Communicator& comm, Args&&... args) {
  return make_module_on<M>(comm, ModuleSeed{}, std::forward<Args>(args)...);
}

// Makes every parameter of `module` (and its descendants) a placeholder:
// the same tensor object, requires_grad and shape, over a storage with no
// memory; with `which`, only the parameters it accepts by name (relative to
// `module`), e.g. all but LoRA adapters, whose initial values are not in a
// pretrained checkpoint. placeholder() returns the module, so that a model
// can be built as blocks->push_back(zest::placeholder(Block(config))).
void make_placeholders(torch::nn::Module& module, const std::function<bool(const std::string& name)>& which = {});
bool is_placeholder(const torch::Tensor& param);

template <typename M>
M placeholder(M module) {
  if constexpr (requires { module.ptr(); }) {
    make_placeholders(*module.ptr());
  } else {
    make_placeholders(*module);
  }
  return module;
}

}  // namespace zest
