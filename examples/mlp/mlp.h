// The model of the example: a multi-layer perceptron with its own forward
// and backward (host loops here; cuBLAS and small kernels on a GPU, see
// mlp_cuda.h), trained through the engine. This is the part a
// user replaces with their own layers; what matters is how it talks to the
// engine:
//
//   forward:  gather each layer's unit, read its parameters, release it
//   backward: gather it again, write its gradients, done() each unit, last
//             layer first, so the engine reduces them while backward goes on
//
// Each layer is one unit: weight [out, in] and bias [out] (the bias in the
// "no_decay" group, as is usual for AdamW).
#pragma once

#include <string>
#include <vector>

#include "zest/engine/engine.h"

namespace mlp {

class DeviceContext;  // mlp_cuda.h

struct Shape {
  int input = 64;
  int hidden = 256;
  int output = 16;
  int layers = 4;  // linear layers; ReLU between them

  int in_of(int layer) const { return layer == 0 ? input : hidden; }
  int out_of(int layer) const { return layer == layers - 1 ? output : hidden; }
  long parameters() const;
};

std::string weight_name(int layer);
std::string bias_name(int layer);

// Declares the layers as units; returns nothing since unit i is layer i.
void register_layers(zest::Engine& engine, const Shape& shape);

// One micro-batch: rows of `input` features and `output` targets.
struct Batch {
  int rows = 0;
  std::vector<float> x;  // rows x input
  std::vector<float> y;  // rows x output
};

// Forward, mean-squared-error loss, and backward of the loss times
// engine.loss_scale(), with the gradients handed to the engine. Returns the
// micro-batch's loss. On a host engine the loops of mlp.cpp run and `device`
// is not needed; on a CUDA engine (engine.stream() on a GPU) the device path
// of mlp_cuda.h runs, and `device` must be the rank's DeviceContext.
float forward_backward(zest::Engine& engine, const Shape& shape, const Batch& batch,
                       DeviceContext* device = nullptr);

// Forward only: the loss on `batch`.
float evaluate(zest::Engine& engine, const Shape& shape, const Batch& batch, DeviceContext* device = nullptr);

}  // namespace mlp
