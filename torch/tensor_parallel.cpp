#include "zest/torch/tensor_parallel.h"

#include <cmath>

#include "zest/core/check.h"
#include "zest/torch/torch_module.h"

namespace zest::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

DType zest_dtype(const torch::Tensor& t) {
  return from_torch_dtype(t.scalar_type(), "tensor-parallel tensors");
}

Stream stream_of(const Communicator& c) { return Stream::default_for(c.device()); }

// The communicator travels through autograd's saved data as an integer:
// AutogradContext keeps IValues, which hold no raw pointers.
void save_comm(AutogradContext* ctx, Communicator& c, int64_t dim = 0) {
  ctx->saved_data["comm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(&c));
  ctx->saved_data["dim"] = dim;
}
Communicator& saved_comm(AutogradContext* ctx) {
  return *reinterpret_cast<Communicator*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
}
int64_t saved_dim(AutogradContext* ctx) { return ctx->saved_data["dim"].toInt(); }

int64_t wrap_dim(const torch::Tensor& x, int64_t dim) {
  const int64_t n = x.dim();
  ZEST_CHECK(dim >= -n && dim < n, "dimension {} is out of range for a tensor of {} dimensions", dim, n);
  return dim < 0 ? dim + n : dim;
}

torch::Tensor all_reduce(const torch::Tensor& x, Communicator& c, ReduceOp op = ReduceOp::kSum) {
  torch::Tensor out = x.contiguous().clone();
  if (c.size() > 1)
    c.all_reduce(out.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()), zest_dtype(out), op,
                 stream_of(c));
  return out;
}

// Rank-major blocks along `dim`: the whole tensor from every rank's part.
torch::Tensor all_gather(const torch::Tensor& x, Communicator& c, int64_t dim) {
  if (c.size() == 1) return x;
  dim = wrap_dim(x, dim);
  // The collective gathers contiguous blocks, so the split dimension goes
  // first and comes back after.
  torch::Tensor part = x.movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = part.sizes().vec();
  shape[0] *= c.size();
  torch::Tensor whole = torch::empty(shape, part.options());
  c.all_gather(part.data_ptr(), whole.data_ptr(), static_cast<size_t>(part.numel()), zest_dtype(part),
               stream_of(c));
  return whole.movedim(0, dim);
}

torch::Tensor reduce_scatter(const torch::Tensor& x, Communicator& c, int64_t dim) {
  if (c.size() == 1) return x;
  dim = wrap_dim(x, dim);
  ZEST_CHECK(x.size(dim) % c.size() == 0,
             "reduce-scatter along dimension {} of size {}: not a multiple of the {} tensor-parallel ranks", dim,
             x.size(dim), c.size());
  torch::Tensor whole = x.movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = whole.sizes().vec();
  shape[0] /= c.size();
  torch::Tensor part = torch::empty(shape, whole.options());
  c.reduce_scatter(whole.data_ptr(), part.data_ptr(), static_cast<size_t>(part.numel()), zest_dtype(whole),
                   ReduceOp::kSum, stream_of(c));
  return part.movedim(0, dim);
}

torch::Tensor split_part(const torch::Tensor& x, const Communicator& c, int64_t dim) {
  if (c.size() == 1) return x;
  dim = wrap_dim(x, dim);
  ZEST_CHECK(x.size(dim) % c.size() == 0,
             "splitting dimension {} of size {} over {} tensor-parallel ranks: not a multiple", dim, x.size(dim),
             c.size());
  return x.chunk(c.size(), dim)[static_cast<size_t>(c.rank())].contiguous();
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* c) {
    save_comm(ctx, *c);
    return x;  // autograd makes the returned input a view of itself
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {all_reduce(g[0], saved_comm(ctx)), torch::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, Communicator* c) {
    return all_reduce(x, *c);
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], torch::Tensor()}; }
};

struct GatherFromRegion : torch::autograd::Function<GatherFromRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* c, int64_t dim) {
    save_comm(ctx, *c, dim);
    return all_gather(x, *c, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {split_part(g[0], saved_comm(ctx), saved_dim(ctx)), torch::Tensor(), torch::Tensor()};
  }
};

struct ScatterToRegion : torch::autograd::Function<ScatterToRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* c, int64_t dim) {
    save_comm(ctx, *c, dim);
    return split_part(x, *c, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {all_gather(g[0], saved_comm(ctx), saved_dim(ctx)), torch::Tensor(), torch::Tensor()};
  }
};

struct GatherFromSequence : torch::autograd::Function<GatherFromSequence> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* c, int64_t dim) {
    save_comm(ctx, *c, dim);
    return all_gather(x, *c, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {reduce_scatter(g[0], saved_comm(ctx), saved_dim(ctx)), torch::Tensor(), torch::Tensor()};
  }
};

struct ReduceScatterToSequence : torch::autograd::Function<ReduceScatterToSequence> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* c, int64_t dim) {
    save_comm(ctx, *c, dim);
    return reduce_scatter(x, *c, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {all_gather(g[0], saved_comm(ctx), saved_dim(ctx)), torch::Tensor(), torch::Tensor()};
  }
};

// Megatron's _VocabParallelCrossEntropy: the loss of each row from three
// all-reduced numbers (the max logit, the sum of exponentials, the target's
// logit), never the whole logits.
struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits_in, const torch::Tensor& target,
                               Communicator* c) {
    torch::Tensor logits = logits_in.to(torch::kFloat);
    const int64_t part = logits.size(-1);
    const int64_t start = part * c->rank();
    torch::Tensor max = all_reduce(std::get<0>(logits.max(-1)), *c, ReduceOp::kMax);
    logits = logits - max.unsqueeze(-1);
    const torch::Tensor outside = (target < start).logical_or(target >= start + part);
    const torch::Tensor local = (target - start).masked_fill(outside, 0);
    torch::Tensor predicted = logits.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0);
    predicted = all_reduce(predicted, *c);
    torch::Tensor exp = logits.exp();
    const torch::Tensor sum_exp = all_reduce(exp.sum(-1), *c);
    const torch::Tensor loss = sum_exp.log() - predicted;
    exp.div_(sum_exp.unsqueeze(-1));  // softmax, kept for backward
    ctx->save_for_backward({exp, local, outside});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits_in.scalar_type());
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const variable_list saved = ctx->get_saved_variables();
    torch::Tensor grad = saved[0].clone();
    const torch::Tensor hit = saved[2].logical_not().to(torch::kFloat).unsqueeze(-1);
    grad.scatter_add_(-1, saved[1].unsqueeze(-1), -hit);
    grad.mul_(g[0].to(torch::kFloat).unsqueeze(-1));
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), torch::Tensor(), torch::Tensor()};
  }
};

int64_t part_of(int64_t whole, const Communicator& c, const char* what) {
  ZEST_CHECK(whole > 0 && whole % c.size() == 0,
             "{} is {}: it must be a positive multiple of the {} tensor-parallel ranks (pad it, as Megatron pads "
             "the vocabulary to make_vocab_size_divisible_by x tp)",
             what, whole, c.size());
  return whole / c.size();
}

// torch::nn::Linear's initialization of the whole [out, in] weight and [out]
// bias, from the global generator, as Megatron's CPU initialization draws
// the master weight before keeping a part.
std::pair<torch::Tensor, torch::Tensor> whole_linear(int64_t in, int64_t out, bool bias) {
  torch::NoGradGuard no_grad;
  torch::Tensor w = torch::empty({out, in});
  torch::nn::init::kaiming_uniform_(w, std::sqrt(5.0));
  torch::Tensor b;
  if (bias) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    b = torch::empty({out});
    torch::nn::init::uniform_(b, -bound, bound);
  }
  return {w, b};
}

void assign(torch::Tensor& param, const torch::Tensor& value) {
  torch::NoGradGuard no_grad;
  param.copy_(value);
}

}  // namespace

torch::Tensor copy_to_region(const torch::Tensor& x, Communicator& tp) { return CopyToRegion::apply(x, &tp); }
torch::Tensor reduce_from_region(const torch::Tensor& x, Communicator& tp) {
  return ReduceFromRegion::apply(x, &tp);
}
torch::Tensor gather_from_region(const torch::Tensor& x, Communicator& tp, int64_t dim) {
  return GatherFromRegion::apply(x, &tp, dim);
}
torch::Tensor scatter_to_region(const torch::Tensor& x, Communicator& tp, int64_t dim) {
  return ScatterToRegion::apply(x, &tp, dim);
}
torch::Tensor gather_from_sequence_region(const torch::Tensor& x, Communicator& tp, int64_t dim) {
  return GatherFromSequence::apply(x, &tp, dim);
}
torch::Tensor reduce_scatter_to_sequence_region(const torch::Tensor& x, Communicator& tp, int64_t dim) {
  return ReduceScatterToSequence::apply(x, &tp, dim);
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(Communicator& tp, const ParallelLinearOptions& o)
    : options(o), tp_(&tp) {
  const int64_t rows = part_of(o.out_features(), tp, "ColumnParallelLinear's out_features");
  ZEST_CHECK(o.stride() >= 1 && o.out_features() % (o.stride() * tp.size()) == 0,
             "ColumnParallelLinear's out_features {} is not a multiple of stride {} x {} tensor-parallel ranks",
             o.out_features(), o.stride(), tp.size());
  ZEST_CHECK(o.in_features() > 0, "ColumnParallelLinear's in_features is {}: it must be positive", o.in_features());
  weight = register_parameter("weight", torch::empty({rows, o.in_features()}));
  if (o.bias()) bias = register_parameter("bias", torch::empty({rows}));
  reset_parameters();
}

void ColumnParallelLinearImpl::reset_parameters() {
  auto [w, b] = whole_linear(options.in_features(), options.out_features(), options.bias());
  assign(weight, partition(w, 0, tp_->rank(), tp_->size(), options.stride()));
  if (options.bias()) assign(bias, partition(b, 0, tp_->rank(), tp_->size(), options.stride()));
}

// Note [LoRA on a split layer]: the adapters keep the one-rank arithmetic,
// y += scale * (x A^T) B^T, and every replicated adapter's gradient equal on
// every tp rank (NeMo's parallel adapters split them alike).
// - Column-parallel: A [r, in] whole, B [out/tp, r] this rank's rows. h = x
//   A^T is the same on every rank; each rank's B gives its slice of the
//   output. h's gradient is a sum over the slices, so h passes through
//   copy_to_region (backward: all-reduce): A's gradient comes out whole and
//   equal on every rank, and the input's gradient through A whole too. The
//   adapter reads the input before the base's copy_to_region, whose
//   all-reduce would add that whole gradient tp times.
// - Row-parallel: A [r, in/tp] this rank's columns, B [out, r] whole. The
//   partial products x_r A_r^T are all-reduced (reduce_from_region) into h
//   = x A^T, then B applies on every rank: B's gradient, from the output's
//   (replicated) gradient and h, is equal on every rank; A_r's is this
//   rank's columns of the whole one.
namespace {

void check_lora(const LoraOptions& lora, bool enabled, bool sequence_parallel, const char* layer) {
  lora.validate();
  ZEST_CHECK(!enabled, "this {}'s adapters are enabled already (r = {}): enable them once", layer, lora.r);
  ZEST_CHECK(!sequence_parallel, "LoRA on a {} with sequence parallelism is not supported: turn one of them off",
             layer);
  ZEST_CHECK(lora.dropout == 0.0,
             "LoRA dropout {} on a {}: each tensor-parallel rank would draw its own mask for the same input; set "
             "dropout to 0",
             lora.dropout, layer);
}

torch::nn::Linear adapter(torch::nn::Module& m, const char* name, int64_t in, int64_t out, const torch::Tensor& value) {
  torch::nn::Linear l = m.register_module(name, torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)));
  torch::NoGradGuard no_grad;
  l->weight.copy_(value);
  return l;
}

}  // namespace

void ColumnParallelLinearImpl::enable_lora(const LoraOptions& lora, at::Generator generator) {
  check_lora(lora, lora_enabled(), options.sequence_parallel(), "ColumnParallelLinear");
  lora_ = lora;
  const int64_t rows = weight.size(0);
  lora_A = adapter(*this, "lora_A", options.in_features(), lora.r,
                   lora_A_initial(lora.r, options.in_features(), std::move(generator)));
  lora_B = adapter(*this, "lora_B", lora.r, rows, torch::zeros({rows, lora.r}));
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& input) {
  const torch::Tensor x = options.sequence_parallel()
                              ? gather_from_sequence_region(input, *tp_, options.sequence_dim())
                              : copy_to_region(input, *tp_);
  torch::Tensor y = torch::linear(x, weight, bias);  // as LoraLinear's (lora.cpp says why)
  if (lora_enabled()) {
    const torch::Tensor h = copy_to_region(lora_A->forward(input), *tp_);
    y = y + lora_B->forward(h) * lora_.scale();
  }
  return options.gather_output() ? gather_from_region(y, *tp_, -1) : y;
}

RowParallelLinearImpl::RowParallelLinearImpl(Communicator& tp, const ParallelLinearOptions& o)
    : options(o), tp_(&tp) {
  const int64_t cols = part_of(o.in_features(), tp, "RowParallelLinear's in_features");
  ZEST_CHECK(o.out_features() > 0, "RowParallelLinear's out_features is {}: it must be positive",
             o.out_features());
  weight = register_parameter("weight", torch::empty({o.out_features(), cols}));
  if (o.bias()) bias = register_parameter("bias", torch::empty({o.out_features()}));
  reset_parameters();
}

void RowParallelLinearImpl::reset_parameters() {
  auto [w, b] = whole_linear(options.in_features(), options.out_features(), options.bias());
  assign(weight, split_part(w, *tp_, 1));
  if (options.bias()) assign(bias, b);
}

void RowParallelLinearImpl::enable_lora(const LoraOptions& lora, at::Generator generator) {
  check_lora(lora, lora_enabled(), options.sequence_parallel(), "RowParallelLinear");
  lora_ = lora;
  const torch::Tensor whole = lora_A_initial(lora.r, options.in_features(), std::move(generator));
  lora_A = adapter(*this, "lora_A", weight.size(1), lora.r, split_part(whole, *tp_, 1));
  lora_B = adapter(*this, "lora_B", lora.r, options.out_features(), torch::zeros({options.out_features(), lora.r}));
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& input) {
  const torch::Tensor x = options.input_is_parallel() ? input : scatter_to_region(input, *tp_, -1);
  const torch::Tensor partial = torch::linear(x, weight);
  if (!options.sequence_parallel()) {
    torch::Tensor y = reduce_from_region(partial, *tp_);
    if (options.bias()) y = y + bias;
    if (lora_enabled()) y = y + lora_B->forward(reduce_from_region(lora_A->forward(x), *tp_)) * lora_.scale();
    return y;
  }
  // Each rank adds the bias to its part of the sequence, so the bias's
  // gradient is a partial sum: copy_to_region all-reduces it.
  const torch::Tensor y = reduce_scatter_to_sequence_region(partial, *tp_, options.sequence_dim());
  return options.bias() ? y + copy_to_region(bias, *tp_) : y;
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(Communicator& tp, const VocabParallelEmbeddingOptions& o)
    : options(o), tp_(&tp) {
  const int64_t rows = part_of(o.num_embeddings(), tp, "VocabParallelEmbedding's num_embeddings");
  ZEST_CHECK(o.embedding_dim() > 0, "VocabParallelEmbedding's embedding_dim is {}: it must be positive",
             o.embedding_dim());
  vocab_start_ = rows * tp.rank();
  weight = register_parameter("weight", torch::empty({rows, o.embedding_dim()}));
  reset_parameters();
}

void VocabParallelEmbeddingImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  torch::Tensor w = torch::empty({options.num_embeddings(), options.embedding_dim()});
  torch::nn::init::normal_(w);
  assign(weight, split_part(w, *tp_, 0));
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& tokens) {
  ZEST_CHECK(tokens.scalar_type() == torch::kLong, "VocabParallelEmbedding takes int64 token ids, not {}",
             c10::toString(tokens.scalar_type()));
  const int64_t rows = weight.size(0);
  const torch::Tensor outside = (tokens < vocab_start_).logical_or(tokens >= vocab_start_ + rows);
  const torch::Tensor local = (tokens - vocab_start_).masked_fill(outside, 0);
  const torch::Tensor rows_of = torch::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0.0);
  return options.sequence_parallel() ? reduce_scatter_to_sequence_region(rows_of, *tp_, options.sequence_dim())
                                     : reduce_from_region(rows_of, *tp_);
}

SequenceParallelLayerNormImpl::SequenceParallelLayerNormImpl(Communicator& tp, int64_t dim, double eps)
    : tp_(&tp), dim_(dim), eps_(eps) {
  ZEST_CHECK(dim > 0, "SequenceParallelLayerNorm's dimension is {}: it must be positive", dim);
  weight = register_parameter("weight", torch::ones({dim}));
  bias = register_parameter("bias", torch::zeros({dim}));
}

torch::Tensor SequenceParallelLayerNormImpl::forward(const torch::Tensor& input) {
  return torch::layer_norm(input, {dim_}, copy_to_region(weight, *tp_), copy_to_region(bias, *tp_), eps_);
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                           Communicator& tp) {
  ZEST_CHECK(logits.dim() >= 1 && target.sizes() == logits.sizes().slice(0, logits.dim() - 1),
             "vocab_parallel_cross_entropy: target's shape {} must be the logits' {} without the last dimension",
             c10::str(target.sizes()), c10::str(logits.sizes()));
  ZEST_CHECK(target.scalar_type() == torch::kLong, "vocab_parallel_cross_entropy takes int64 targets, not {}",
             c10::toString(target.scalar_type()));
  return VocabParallelCrossEntropy::apply(logits, target, &tp);
}

namespace {

// The split parameters of the layers above, in module order.
std::vector<std::pair<std::string, TpSplit>> split_parameters(const torch::nn::Module& root) {
  std::vector<std::pair<std::string, const torch::nn::Module*>> modules{{"", &root}};
  // Not include_self: the root may not be held by a shared_ptr.
  for (const auto& item : root.named_modules("", /*include_self=*/false))
    modules.emplace_back(item.key() + ".", item.value().get());
  std::vector<std::pair<std::string, TpSplit>> out;
  for (const auto& [prefix, m] : modules) {
    if (const auto* c = dynamic_cast<const ColumnParallelLinearImpl*>(m)) {
      const TpSplit rows{0, static_cast<int>(c->options.stride())};
      out.emplace_back(prefix + "weight", rows);
      if (c->options.bias()) out.emplace_back(prefix + "bias", rows);
      if (c->lora_enabled()) out.emplace_back(prefix + "lora_B.weight", rows);
    } else if (const auto* r = dynamic_cast<const RowParallelLinearImpl*>(m)) {
      out.emplace_back(prefix + "weight", TpSplit{1, 1});
      if (r->lora_enabled()) out.emplace_back(prefix + "lora_A.weight", TpSplit{1, 1});
    } else if (dynamic_cast<const VocabParallelEmbeddingImpl*>(m)) {
      out.emplace_back(prefix + "weight", TpSplit{0, 1});
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> partitioned_parameters(const torch::nn::Module& root) {
  std::vector<std::string> names;
  for (auto& [name, split] : split_parameters(root)) names.push_back(std::move(name));
  return names;
}

std::map<std::string, TpSplit> partitioned_parameter_splits(const torch::nn::Module& root) {
  std::map<std::string, TpSplit> out;
  for (auto& [name, split] : split_parameters(root)) out.emplace(std::move(name), split);
  return out;
}

torch::Tensor partition(const torch::Tensor& whole, int64_t dim, int tp_rank, int tp_size, int64_t stride) {
  dim = wrap_dim(whole, dim);
  ZEST_CHECK(stride >= 1 && tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size,
             "partition: tp rank {} of {} with stride {}", tp_rank, tp_size, stride);
  ZEST_CHECK(whole.size(dim) % (stride * tp_size) == 0,
             "partition: dimension {} of size {} is not a multiple of stride {} x {} tensor-parallel ranks", dim,
             whole.size(dim), stride, tp_size);
  const int64_t piece = whole.size(dim) / (stride * tp_size);
  std::vector<torch::Tensor> mine;
  for (int64_t s = 0; s < stride; ++s) mine.push_back(whole.narrow(dim, (s * tp_size + tp_rank) * piece, piece));
  return torch::cat(mine, dim).contiguous();
}

}  // namespace zest::tp
