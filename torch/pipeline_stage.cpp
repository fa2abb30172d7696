#include "zest/torch/pipeline_stage.h"

#include <array>
#include <bit>
#include <chrono>
#include <map>
#include <optional>

#include "zest/core/check.h"

// Note [tied weights]
// Megatron ties the word embedding of the first stage to the output layer
// of the last by keeping a trained copy on each and all-reducing their
// gradients before the step. Under ZeRO the two copies would be shards at
// different offsets of the two stages' partitions and need two optimizer
// states; here the first stage alone trains the weight and the last holds a
// plain copy, which moves the same bytes per batch: the copy's gradient one
// way, the new values the other. The gradient has to reach the engine while
// the weight's unit accumulates (Note [gradients in place] in
// torch_module_hooks.cpp), that is, inside the first stage's backward: tied()
// puts a node on the embedding's output whose backward, in the batch's last
// backward on that stage, receives the copy's gradient and passes it to the
// weight's accumulator beside the embedding's own. The last stage sends it
// after its last backward has sent its input's gradient on, so every stage
// between can finish first: no stage waits on one that waits on it. The sum
// is that of the whole model's gradient in another order: equal within
// rounding, not bit for bit. A frozen weight (the base of a LoRA run) is
// sent once, at the tie, and nothing moves per batch.
namespace zest {
namespace {

DType zest_dtype(torch::ScalarType t) { return from_torch_dtype(t, "pipeline activations"); }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Tags keep an activation and a gradient apart should stages ever disagree
// on the schedule: the mismatch is then named, not a wrong tensor used.
constexpr uint64_t kActivationTag = 1;
constexpr uint64_t kGradientTag = 2;
constexpr uint64_t kTiedGradientTag = 3;
constexpr uint64_t kTiedValuesTag = 4;
constexpr uint64_t kTiedShapeTag = 5;
constexpr uint64_t kEvaluationTag = 6;

// Two integers each way with `peer`, through the communicator's device.
// The tied weight's description: its element count, its dtype and whether
// it trains (1) or is frozen (0: a LoRA run's base).
using TiedDescription = std::array<int64_t, 3>;

TiedDescription exchange(Communicator& group, int peer, const TiedDescription& mine) {
  const torch::Device device = torch_device(group.device());
  torch::Tensor out = torch::tensor({mine[0], mine[1], mine[2]}, torch::kLong).to(device);
  torch::Tensor in = torch::empty({3}, torch::TensorOptions().dtype(torch::kLong).device(device));
  std::vector<P2POp> ops = {P2POp::send(out.data_ptr(), 3, DType::kInt64, peer, kTiedShapeTag),
                            P2POp::recv(in.data_ptr(), 3, DType::kInt64, peer, kTiedShapeTag)};
  group.send_recv(ops, Stream::default_for(group.device()));
  in = in.cpu();
  return {in[0].item<int64_t>(), in[1].item<int64_t>(), in[2].item<int64_t>()};
}

// The tied weight's node (Note [tied weights]): x passes through; its
// backward receives the last stage's gradient for `weight`.
struct ReceiveTiedGradient : torch::autograd::Function<ReceiveTiedGradient> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, Communicator* group) {
    ctx->saved_data["group"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(group));
    ctx->saved_data["shape"] = weight.sizes().vec();
    ctx->saved_data["dtype"] = static_cast<int64_t>(weight.scalar_type());
    return x;  // autograd makes the returned input a view of itself
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    auto& group = *reinterpret_cast<Communicator*>(static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    torch::Tensor from_last = torch::empty(ctx->saved_data["shape"].toIntVector(),
                                           torch::TensorOptions().dtype(dtype).device(g[0].device()));
    group.recv(from_last.data_ptr(), static_cast<size_t>(from_last.numel()), zest_dtype(dtype), 1,
               Stream::default_for(group.device()), kTiedGradientTag);
    return {g[0], from_last, torch::Tensor()};
  }
};

}  // namespace

PipelineStage::PipelineStage(Communicator& pp, TorchModule& zt, PipelineOptions options)
    : pp_(&pp), zt_(&zt), options_(std::move(options)) {
  const int64_t accumulation = zt.engine().config().accumulation_steps();
  ZEST_CHECK(accumulation == options_.micro_batches,
             "the pipeline runs {} micro-batches per batch but the engine's gradient_accumulation_steps is {}: set "
             "it to {}, so the engine steps once per batch and averages over its micro-batches",
             options_.micro_batches, accumulation, options_.micro_batches);
  ZEST_CHECK(!options_.activation_shape.empty(),
             "PipelineOptions::activation_shape is empty: give the shape of the tensor one stage passes the next "
             "for one micro-batch");
  for (const int64_t d : options_.activation_shape)
    ZEST_CHECK(d > 0, "PipelineOptions::activation_shape {} has a dimension that is not positive",
               c10::str(c10::IntArrayRef(options_.activation_shape)));
  (void)zest_dtype(options_.activation_dtype);
  (void)pipeline_schedule(options_.schedule, pp.size(), pp.rank(), options_.micro_batches);  // validates
}

torch::Tensor PipelineStage::receive_buffer() const {
  return torch::empty(options_.activation_shape,
                      torch::TensorOptions().dtype(options_.activation_dtype).device(torch_device(pp_->device())));
}

void PipelineStage::check_activation(const torch::Tensor& t, const char* what) const {
  ZEST_CHECK(t.defined(), "pipeline stage {}: the {} is undefined", stage(), what);
  ZEST_CHECK(t.sizes() == c10::IntArrayRef(options_.activation_shape) && t.scalar_type() == options_.activation_dtype,
             "pipeline stage {}: the {} is {} {}, not PipelineOptions' activation {} {}", stage(), what,
             c10::str(t.sizes()), c10::toString(t.scalar_type()),
             c10::str(c10::IntArrayRef(options_.activation_shape)), c10::toString(options_.activation_dtype));
}

PipelineStage::Result PipelineStage::run(const Forward& forward, const Loss& loss) {
  const auto batch_start = std::chrono::steady_clock::now();
  const std::vector<PipelineAction> actions =
      pipeline_schedule(options_.schedule, stages(), stage(), options_.micro_batches);
  const Stream stream = Stream::default_for(pp_->device());
  const DType dtype = zest_dtype(options_.activation_dtype);
  const size_t count = static_cast<size_t>(c10::multiply_integers(options_.activation_shape));

  struct InFlight {
    torch::Tensor input;   // received (a leaf requiring grad), undefined on the first stage
    torch::Tensor output;  // sent on, or the loss on the last stage
  };
  std::map<int, InFlight> live;             // micro-batches between their forward and backward
  std::map<int, torch::Tensor> inputs;      // received ahead, by micro-batch
  std::map<int, torch::Tensor> out_grads;   // gradients received ahead, by micro-batch
  Result result{};
  // Summed where the losses are, read once: on a GPU each read waits for
  // the stream.
  torch::Tensor loss_sum;
  for (const PipelineAction& a : actions)
    if (a.pass == PipelinePass::kBackward) last_backward_mb_ = a.micro_batch;
  int backwards = 0;

  // One action's outgoing transfer, started together with the next action's
  // incoming one when the schedule pairs them.
  const auto transfer = [&](std::optional<torch::Tensor> outgoing, int to, uint64_t out_tag,
                            std::map<int, torch::Tensor>* incoming, int incoming_mb, int from, uint64_t in_tag) {
    std::vector<P2POp> ops;
    if (outgoing) ops.push_back(P2POp::send(outgoing->data_ptr(), count, dtype, to, out_tag));
    if (incoming) {
      torch::Tensor buffer = receive_buffer();
      ops.push_back(P2POp::recv(buffer.data_ptr(), count, dtype, from, in_tag));
      (*incoming)[incoming_mb] = buffer;
    }
    if (ops.size() == 2) {
      pp_->send_recv(ops, stream);
    } else if (ops.size() == 1) {
      const P2POp& op = ops[0];
      if (op.is_send) pp_->send(op.buffer, op.count, op.dtype, op.peer, stream, op.tag);
      else pp_->recv(op.buffer, op.count, op.dtype, op.peer, stream, op.tag);
    }
  };
  const auto next_of = [&](size_t i) -> const PipelineAction* {
    return i + 1 < actions.size() ? &actions[i + 1] : nullptr;
  };

  for (size_t i = 0; i < actions.size(); ++i) {
    const PipelineAction& a = actions[i];
    const PipelineAction* next = a.paired ? next_of(i) : nullptr;
    const int mb = a.micro_batch;
    if (a.pass == PipelinePass::kForward) {
      InFlight f;
      if (!first()) {
        if (!inputs.count(mb)) transfer(std::nullopt, 0, 0, &inputs, mb, stage() - 1, kActivationTag);
        f.input = inputs.at(mb).requires_grad_();
        inputs.erase(mb);
      }
      const auto t0 = std::chrono::steady_clock::now();
      forward_mb_ = mb;
      const torch::Tensor out = forward(mb, f.input);
      forward_mb_ = -1;
      if (last()) {
        f.output = loss(mb, out);
        ZEST_CHECK(f.output.defined() && f.output.numel() == 1,
                   "pipeline stage {}: the loss of micro-batch {} must be one value, not {}", stage(), mb,
                   f.output.defined() ? c10::str(f.output.sizes()) : std::string("undefined"));
        const torch::Tensor l = f.output.detach().to(torch::kDouble).reshape({});
        loss_sum = loss_sum.defined() ? loss_sum + l : l;
      } else {
        check_activation(out, "forward's output");
        f.output = out;
      }
      result.compute_seconds += seconds_since(t0);
      const bool gets_grad = next != nullptr && !last();  // the paired backward's gradient
      std::optional<torch::Tensor> send;
      if (!last()) send = f.output.detach().contiguous();
      transfer(send, stage() + 1, kActivationTag, gets_grad ? &out_grads : nullptr,
               gets_grad ? next->micro_batch : 0, stage() + 1, kGradientTag);
      live[mb] = std::move(f);
    } else {
      InFlight f = std::move(live.at(mb));
      live.erase(mb);
      if (!last() && !out_grads.count(mb)) transfer(std::nullopt, 0, 0, &out_grads, mb, stage() + 1, kGradientTag);
      const auto t0 = std::chrono::steady_clock::now();
      if (last()) {
        zt_->scale(f.output).backward();
      } else {
        f.output.backward(out_grads.at(mb));
        out_grads.erase(mb);
      }
      result.compute_seconds += seconds_since(t0);
      const bool gets_input = next != nullptr && !first();  // the paired forward's input
      std::optional<torch::Tensor> send;
      if (!first()) {
        ZEST_CHECK(f.input.grad().defined(),
                   "pipeline stage {}: micro-batch {}'s input got no gradient: the stage's forward must use its "
                   "input",
                   stage(), mb);
        send = f.input.grad().contiguous();
      }
      transfer(send, stage() - 1, kGradientTag, gets_input ? &inputs : nullptr, gets_input ? next->micro_batch : 0,
               stage() - 1, kActivationTag);
      const bool batch_done = ++backwards == options_.micro_batches;
      if (batch_done && tied_trains_ && tied_copy_.defined()) send_tied_gradient();
      // The micro-step after the gradient has left: the batch's last one is
      // the optimizer step, collective over the model-parallel group (the
      // global norm), which the earlier stages reach only once they have
      // this gradient.
      const auto t1 = std::chrono::steady_clock::now();
      result.step = zt_->step();
      result.step_seconds += seconds_since(t1);
      if (batch_done && tied_trains_ && (tied_copy_.defined() || tied_weight_.defined())) sync_tied_values();
    }
  }
  // Every stage reports the batch's loss, which only the last one computed.
  result.loss = from_last_stage(*pp_, last() ? loss_sum.item<double>() / options_.micro_batches : 0.0);
  result.batch_seconds = seconds_since(batch_start);
  return result;
}

Communicator& PipelineStage::tied_group(const char* caller) const {
  ZEST_CHECK(options_.tied_group != nullptr && options_.tied_group->size() == 2,
             "PipelineStage::{}: PipelineOptions::tied_group must be the group of the first and the last stage "
             "(DeviceMesh::embedding())",
             caller);
  return *options_.tied_group;
}

void PipelineStage::tie_first(const torch::nn::Module& unit, const torch::Tensor& weight) {
  ZEST_CHECK(first() && !last(), "PipelineStage::tie_first on stage {} of {}: the first stage of two or more calls it",
             stage(), stages());
  Communicator& group = tied_group("tie_first");
  tied_unit_ = zt_->unit_of(unit);
  tied_weight_ = weight;
  // Both stages learn the other's element count and dtype before any values
  // move, so a mismatch is named on both instead of a receive that waits.
  // Its size while gathered: at stage 3 a released parameter is empty.
  tied_trains_ = weight.requires_grad();
  TiedDescription mine{};
  zt_->read(tied_unit_, [&] {
    mine = {weight.numel(), static_cast<int64_t>(weight.scalar_type()), tied_trains_ ? 1 : 0};
  });
  const TiedDescription theirs = exchange(group, 1, mine);
  ZEST_CHECK(mine[0] == theirs[0] && mine[1] == theirs[1],
             "tied weight: the first stage's has {} elements of {}, the last stage's copy {} of {}: give tie_last the "
             "weight's shape and dtype",
             mine[0], c10::toString(weight.scalar_type()), theirs[0],
             c10::toString(static_cast<torch::ScalarType>(theirs[1])));
  sync_tied_values();
}

torch::Tensor PipelineStage::tie_last(const std::vector<int64_t>& shape, torch::ScalarType dtype) {
  ZEST_CHECK(last() && !first(), "PipelineStage::tie_last on stage {} of {}: the last stage of two or more calls it",
             stage(), stages());
  Communicator& group = tied_group("tie_last");
  tied_copy_ = torch::zeros(shape, torch::TensorOptions().dtype(dtype).device(torch_device(pp_->device())));
  const TiedDescription mine = {tied_copy_.numel(), static_cast<int64_t>(dtype), 0};
  const TiedDescription theirs = exchange(group, 0, mine);
  ZEST_CHECK(mine[0] == theirs[0] && mine[1] == theirs[1],
             "tied weight: the last stage's copy is {} {} ({} elements), the first stage's weight has {} elements "
             "of {}: give tie_last the weight's shape and dtype",
             c10::str(c10::IntArrayRef(shape)), c10::toString(dtype), mine[0], theirs[0],
             c10::toString(static_cast<torch::ScalarType>(theirs[1])));
  sync_tied_values();
  // A frozen weight's copy is a constant: no gradient goes back and its
  // values never change.
  tied_trains_ = theirs[2] == 1;
  if (tied_trains_) tied_copy_.requires_grad_();
  return tied_copy_;
}

torch::Tensor PipelineStage::tied(const torch::Tensor& x) {
  ZEST_CHECK(tied_weight_.defined(), "PipelineStage::tied before tie_first (stage {})", stage());
  if (!tied_trains_ || forward_mb_ < 0 || forward_mb_ != last_backward_mb_) return x;
  return ReceiveTiedGradient::apply(x, tied_weight_, options_.tied_group);
}

void PipelineStage::send_tied_gradient() {
  Communicator& group = *options_.tied_group;
  torch::Tensor g = tied_copy_.grad();
  if (!g.defined()) g = torch::zeros_like(tied_copy_);  // the forward did not use it
  g = g.contiguous();
  group.send(g.data_ptr(), static_cast<size_t>(g.numel()), zest_dtype(g.scalar_type()), 0,
             Stream::default_for(group.device()), kTiedGradientTag);
  tied_copy_.mutable_grad() = torch::Tensor();
}

void PipelineStage::sync_tied_values() {
  Communicator& group = *options_.tied_group;
  const Stream stream = Stream::default_for(group.device());
  if (tied_weight_.defined()) {
    // The weight is whole only while its unit is gathered (stage 3).
    zt_->read(tied_unit_, [&] {
      const torch::Tensor w = tied_weight_.detach().contiguous();
      group.send(w.data_ptr(), static_cast<size_t>(w.numel()), zest_dtype(w.scalar_type()), 1, stream,
                 kTiedValuesTag);
    });
  } else {
    torch::NoGradGuard no_grad;
    group.recv(tied_copy_.data_ptr(), static_cast<size_t>(tied_copy_.numel()), zest_dtype(tied_copy_.scalar_type()),
               0, stream, kTiedValuesTag);
  }
}

double from_last_stage(Communicator& pp, double value) {
  if (pp.size() == 1) return value;
  // Sent as the double's bits (no fp64 dtype is needed for one value), from
  // device memory where the communicator's is.
  torch::Tensor bits = torch::tensor({std::bit_cast<int64_t>(value)}, torch::kLong).to(torch_device(pp.device()));
  pp.broadcast(bits.data_ptr(), bits.data_ptr(), 1, DType::kInt64, pp.size() - 1, Stream::default_for(pp.device()));
  return std::bit_cast<double>(bits.cpu().item<int64_t>());
}

torch::Tensor pipeline_forward(Communicator& pp, const std::vector<int64_t>& activation_shape,
                               torch::ScalarType dtype,
                               const std::function<torch::Tensor(const torch::Tensor& input)>& forward) {
  torch::NoGradGuard no_grad;
  const Stream stream = Stream::default_for(pp.device());
  const int stage = pp.rank(), stages = pp.size();
  torch::Tensor input;
  if (stage > 0) {
    input = torch::empty(activation_shape, torch::TensorOptions().dtype(dtype).device(torch_device(pp.device())));
    pp.recv(input.data_ptr(), static_cast<size_t>(input.numel()), zest_dtype(dtype), stage - 1, stream,
            kEvaluationTag);
  }
  torch::Tensor out = forward(input);
  if (stage == stages - 1) return out;
  ZEST_CHECK(out.defined() && out.sizes() == c10::IntArrayRef(activation_shape) && out.scalar_type() == dtype,
             "pipeline_forward: stage {}'s output is {}, not the activation {} {} the next stage receives", stage,
             out.defined() ? c10::str(out.sizes()) + " " + c10::toString(out.scalar_type()) : std::string("undefined"),
             c10::str(c10::IntArrayRef(activation_shape)), c10::toString(dtype));
  out = out.contiguous();
  pp.send(out.data_ptr(), static_cast<size_t>(out.numel()), zest_dtype(dtype), stage + 1, stream, kEvaluationTag);
  return torch::Tensor();
}

}  // namespace zest
