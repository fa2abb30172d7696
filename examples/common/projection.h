// The linear layers of the examples' models, whole or split by tensor
// parallelism under the same name, so that a checkpoint's parameter names do
// not depend on the split.
#pragma once

#include <torch/torch.h>

#include "zest/comm/communicator.h"
#include "zest/torch/lora.h"
#include "zest/torch/tensor_parallel.h"

namespace examples {

// Registers `name` in `m`: a zest::LoraLinear (which LoRA can adapt) of
// options' sizes and bias into `whole` when `tp` is null, else a Parallel
// (zest::tp::ColumnParallelLinear or RowParallelLinear) over `tp` with
// `options` (a column split's stride among them) into `split`. Null `tp`:
// Placement::split_group()'s answer for a whole model.
template <typename Parallel>
void make_projection(torch::nn::Module& m, const char* name, const zest::tp::ParallelLinearOptions& options,
                     zest::Communicator* tp, zest::LoraLinear& whole, Parallel& split) {
  if (tp == nullptr) {
    const auto sizes = zest::LoraLinearOptions(options.in_features(), options.out_features()).bias(options.bias());
    whole = m.register_module(name, zest::LoraLinear(sizes));
  } else {
    split = m.register_module(name, Parallel(*tp, options));
  }
}

}  // namespace examples
