// Tensor (model) parallelism for libtorch, in Megatron-LM's forms (Shoeybi
// et al. 2019; megatron/core/tensor_parallel): a layer's weight split across
// the ranks of a tensor-parallel group `tp`, and the collectives that make
// the split layers compute what the whole layer would, in forward and in
// backward.
//
//   // zest-example: prelude=torch_training
//   // Two ranks of `comm` hold half of the MLP each (a tp group of the whole job here;
//   // with data parallelism as well, the tp group is a split of the world).
//   zest::tp::ColumnParallelLinear up(*comm, zest::tp::ParallelLinearOptions(512, 2048));
//   zest::tp::RowParallelLinear down(*comm, zest::tp::ParallelLinearOptions(2048, 512));
//   torch::Tensor in = torch::randn({4, 512});            // the same on every tp rank
//   torch::Tensor out = down(torch::gelu(up(in)));        // [4, 512], the same on every tp rank
//
// The pieces (Megatron's names in brackets):
// - ColumnParallelLinear: weight [out/tp, in], this rank's rows of the whole
//   weight; y_r = x W_r^T + b_r, so each rank has its slice of the output's
//   last dimension. Backward all-reduces the input's gradient over tp
//   [copy_to_tensor_model_parallel_region]. gather_output all-gathers the
//   slices into the whole output [gather_from_tensor_model_parallel_region].
// - RowParallelLinear: weight [out, in/tp], this rank's columns; the partial
//   products are all-reduced in forward [reduce_from_..._region] and the
//   bias, replicated, is added once after. input_is_parallel false splits a
//   whole input first [scatter_to_..._region].
// - VocabParallelEmbedding: rank r holds the rows of tokens [r V/tp,
//   (r+1) V/tp); a token outside the range looks up zeros, and the all-reduce
//   adds the one rank's row to zeros: exact, bit for bit the whole lookup.
// - vocab_parallel_cross_entropy: cross-entropy over logits split along the
//   vocabulary, without gathering them: a max, a sum of exponentials and the
//   target's logit, each all-reduced over tp (three collectives of one value
//   a row); its backward is softmax minus one-hot on this rank's slice.
// - Sequence parallelism (Korthikanti et al. 2022), an option of each layer:
//   between the layers the activations are split along the sequence
//   dimension (`sequence_dim`, Megatron's is 0 in its [s, b, h] layout), so
//   layer norms and dropout run on 1/tp of the tokens. A column-parallel
//   layer all-gathers its input along the sequence (backward:
//   reduce-scatter), a row-parallel layer reduce-scatters its output
//   instead of all-reducing it, the embedding likewise. A layer norm in the
//   split region is SequenceParallelLayerNorm: its weight and bias pass
//   through copy_to_region, so their gradients (partial sums over this
//   rank's tokens) are all-reduced in backward and come out whole and equal
//   on every tp rank, where Megatron all-reduces them after backward.
//
// - LoRA (torch/lora.h's enable_lora finds these layers by name as it finds
//   LoraLinear): a column-parallel layer's lora_B is split with its rows and
//   lora_A kept whole; a row-parallel layer's lora_A is split with its
//   columns and lora_B kept whole, each adapter starting from the whole
//   one-rank adapter's values (Note [LoRA on a split layer]).
//
// Initialization (Megatron's _initialize_affine_weight_cpu): each layer
// draws the whole weight as torch::nn::Linear / Embedding would, from
// torch's global generator, and keeps its part. With the same seed on every
// tp rank, a tp = 2 model starts from exactly the weights of the tp = 1
// model built after the same seed. Layers are plain torch::nn::Modules with
// torch's parameter names (weight, bias), so a TorchModule trains them; the
// engine of each tp rank shards its part over the data-parallel group.
//
// Replicated parameters: the bias of a RowParallelLinear, layer norms, and
// anything not in one of these layers hold the same values on every tp rank
// and, since the layers' arithmetic makes their gradients equal too, stay
// equal after each step. partitioned_parameters() lists the names that are
// split (different on each tp rank): a global gradient norm counts those on
// every rank and the rest once.
//
// Every tp rank must run the same layers in the same order (the layers'
// collectives pair up like DDP's reductions). On CUDA, torch's current
// stream must be the device's default stream (Stream::default_for), as for
// TorchModule. Dropout inside the split region draws from each rank's own
// generator (Megatron's RNG tracker is not provided).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "zest/comm/communicator.h"
#include "zest/engine/layout.h"
#include "zest/torch/lora.h"

namespace zest::tp {

// Megatron's mappings: the identity in one direction and a collective in the
// other. `dim` is the split dimension (negative counts from the end).
torch::Tensor copy_to_region(const torch::Tensor& x, Communicator& tp);      // fwd x,       bwd all-reduce
torch::Tensor reduce_from_region(const torch::Tensor& x, Communicator& tp);  // fwd all-reduce, bwd x
torch::Tensor gather_from_region(const torch::Tensor& x, Communicator& tp, int64_t dim = -1);  // fwd all-gather, bwd split
torch::Tensor scatter_to_region(const torch::Tensor& x, Communicator& tp, int64_t dim = -1);   // fwd split, bwd all-gather
// Sequence parallelism's: all-gather whose backward reduce-scatters, and the
// reverse.
torch::Tensor gather_from_sequence_region(const torch::Tensor& x, Communicator& tp, int64_t dim = 0);
torch::Tensor reduce_scatter_to_sequence_region(const torch::Tensor& x, Communicator& tp, int64_t dim = 0);

struct ParallelLinearOptions {
  ParallelLinearOptions(int64_t in, int64_t out) : in_features_(in), out_features_(out) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);  // the whole layer's sizes
  TORCH_ARG(bool, bias) = true;
  // Column-parallel: all-gather the output (else each rank keeps its slice).
  TORCH_ARG(bool, gather_output) = false;
  // Row-parallel: the input is already split along its last dimension (the
  // output of a column-parallel layer); false splits a whole input.
  TORCH_ARG(bool, input_is_parallel) = true;
  TORCH_ARG(bool, sequence_parallel) = false;
  TORCH_ARG(int64_t, sequence_dim) = 0;
  // Column-parallel: the whole output is `stride` blocks that are each split
  // over tp (Megatron's partition_stride), so that a fused projection keeps
  // its parts together: GPT's c_attn, [q; k; v] with stride 3, gives each
  // rank its heads' queries, keys and values. out_features must be a
  // multiple of stride x tp.
  TORCH_ARG(int64_t, stride) = 1;
};

class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  ColumnParallelLinearImpl(Communicator& tp, const ParallelLinearOptions& options);
  // Draws the whole weight and bias as torch::nn::Linear would and keeps
  // this rank's rows.
  void reset_parameters();
  // [*, in] (the whole input; under sequence parallelism this rank's part of
  // the sequence) -> [*, out/tp], or [*, out] with gather_output.
  torch::Tensor forward(const torch::Tensor& input);
  // LoRA adapters (Note [LoRA on a split layer] in tensor_parallel.cpp):
  // lora_A [r, in] whole on every tp rank, drawn as PEFT draws it from
  // `generator`; lora_B [out/tp, r], this rank's rows, zero. Throws a
  // zest::Error when enabled already, with sequence parallelism, or with
  // dropout (each rank would draw its own mask).
  void enable_lora(const LoraOptions& lora, at::Generator generator);
  bool lora_enabled() const { return !lora_A.is_empty(); }

  ParallelLinearOptions options;
  torch::Tensor weight;  // [out/tp, in]
  torch::Tensor bias;    // [out/tp], undefined without options.bias()
  torch::nn::Linear lora_A{nullptr}, lora_B{nullptr};  // with enable_lora

 private:
  Communicator* tp_;
  LoraOptions lora_;
};
TORCH_MODULE(ColumnParallelLinear);

class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(Communicator& tp, const ParallelLinearOptions& options);
  void reset_parameters();
  // [*, in/tp] (or [*, in] when !input_is_parallel) -> [*, out], the same on
  // every tp rank (under sequence parallelism: this rank's part of the
  // sequence).
  torch::Tensor forward(const torch::Tensor& input);
  // LoRA adapters: lora_A [r, in/tp], this rank's columns of the whole
  // adapter drawn from `generator`; lora_B [out, r] whole, zero. Refused
  // as ColumnParallelLinear's.
  void enable_lora(const LoraOptions& lora, at::Generator generator);
  bool lora_enabled() const { return !lora_A.is_empty(); }

  ParallelLinearOptions options;
  torch::Tensor weight;  // [out, in/tp]
  torch::Tensor bias;    // [out], replicated
  torch::nn::Linear lora_A{nullptr}, lora_B{nullptr};  // with enable_lora

 private:
  Communicator* tp_;
  LoraOptions lora_;
};
TORCH_MODULE(RowParallelLinear);

struct VocabParallelEmbeddingOptions {
  VocabParallelEmbeddingOptions(int64_t vocab, int64_t dim) : num_embeddings_(vocab), embedding_dim_(dim) {}
  TORCH_ARG(int64_t, num_embeddings);  // the whole vocabulary, a multiple of tp
  TORCH_ARG(int64_t, embedding_dim);
  // Reduce-scatter the output along sequence_dim instead of all-reducing it.
  TORCH_ARG(bool, sequence_parallel) = false;
  TORCH_ARG(int64_t, sequence_dim) = 0;
};

class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(Communicator& tp, const VocabParallelEmbeddingOptions& options);
  // N(0, 1), torch::nn::Embedding's initialization, drawn whole.
  void reset_parameters();
  // Token ids (any shape, int64, all ranks the same) -> [..., dim].
  torch::Tensor forward(const torch::Tensor& tokens);
  int64_t vocab_start() const { return vocab_start_; }  // this rank's first row

  VocabParallelEmbeddingOptions options;
  torch::Tensor weight;  // [vocab/tp, dim]

 private:
  Communicator* tp_;
  int64_t vocab_start_ = 0;
};
TORCH_MODULE(VocabParallelEmbedding);

// A layer norm over the last dimension whose weight and bias gradients are
// all-reduced over tp in backward: for the sequence-parallel region, where
// each rank sees 1/tp of the tokens. torch::nn::LayerNorm's parameters and
// initialization.
class SequenceParallelLayerNormImpl : public torch::nn::Module {
 public:
  SequenceParallelLayerNormImpl(Communicator& tp, int64_t dim, double eps = 1e-5);
  torch::Tensor forward(const torch::Tensor& input);
  torch::Tensor weight, bias;  // [dim], replicated

 private:
  Communicator* tp_;
  int64_t dim_;
  double eps_;
};
TORCH_MODULE(SequenceParallelLayerNorm);

// Per-row cross-entropy (no reduction) of logits split along the vocabulary:
// `logits` [..., V/tp] is this rank's slice (rank r holds classes [r V/tp,
// (r+1) V/tp)), `target` [...] the whole class ids, the same on every rank.
// Equals torch::nn::functional::cross_entropy of the gathered logits with
// reduction none; computed in fp32 whatever the logits' dtype.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                           Communicator& tp);

// The names (as root.named_parameters() gives them) of the parameters that
// the layers above split across tp. Every other parameter is replicated.
std::vector<std::string> partitioned_parameters(const torch::nn::Module& root);
// The same parameters, each with how it is split (the rows of a
// column-parallel weight and bias and of an embedding: dim 0, with the
// layer's stride; a row-parallel weight's columns: dim 1), which an export
// of the whole model joins the slices back by (TorchModule passes them on as
// ParamSpec::tp_split).
std::map<std::string, TpSplit> partitioned_parameter_splits(const torch::nn::Module& root);

// This tp rank's part of a whole tensor split along `dim`: `stride` blocks,
// each cut into tp equal pieces, piece tp_rank of each block in block order
// (stride 1: the tp_rank-th of tp equal chunks). What the layers above keep
// of their whole weights; a model that initializes its whole weights itself
// uses it to keep the same part. Throws naming the sizes when dim's size is
// not a multiple of stride x tp_size.
torch::Tensor partition(const torch::Tensor& whole, int64_t dim, int tp_rank, int tp_size, int64_t stride = 1);

}  // namespace zest::tp
