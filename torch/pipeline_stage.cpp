#include "zest/torch/pipeline_stage.h"

#include <bit>
#include <chrono>
#include <map>
#include <optional>

#include "zest/core/check.h"

namespace zest {
namespace {

DType zest_dtype(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return DType::kFloat32;
    case torch::kHalf: return DType::kFloat16;
    case torch::kBFloat16: return DType::kBFloat16;
    default: ZEST_FAIL("pipeline activations are float32, float16 or bfloat16, not {}", c10::toString(t));
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Tags keep an activation and a gradient apart should stages ever disagree
// on the schedule: the mismatch is then named, not a wrong tensor used.
constexpr uint64_t kActivationTag = 1;
constexpr uint64_t kGradientTag = 2;

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
  double loss_sum = 0;

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
      const torch::Tensor out = forward(mb, f.input);
      if (last()) {
        f.output = loss(mb, out);
        ZEST_CHECK(f.output.defined() && f.output.numel() == 1,
                   "pipeline stage {}: the loss of micro-batch {} must be one value, not {}", stage(), mb,
                   f.output.defined() ? c10::str(f.output.sizes()) : std::string("undefined"));
        loss_sum += f.output.detach().to(torch::kDouble).item<double>();
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
      // The micro-step after the gradient has left: the batch's last one is
      // the optimizer step, collective over the model-parallel group (the
      // global norm), which the earlier stages reach only once they have
      // this gradient.
      const auto t1 = std::chrono::steady_clock::now();
      result.step = zt_->step();
      result.step_seconds += seconds_since(t1);
    }
  }
  // Every stage reports the batch's loss, which only the last one computed.
  // Sent as the double's bits (no fp64 dtype is needed for one value), from
  // device memory where the communicator's is.
  double mean = last() ? loss_sum / options_.micro_batches : 0.0;
  if (stages() > 1) {
    torch::Tensor bits = torch::tensor({std::bit_cast<int64_t>(mean)}, torch::kLong).to(torch_device(pp_->device()));
    pp_->broadcast(bits.data_ptr(), bits.data_ptr(), 1, DType::kInt64, stages() - 1, stream);
    mean = std::bit_cast<double>(bits.cpu().item<int64_t>());
  }
  result.loss = mean;
  result.batch_seconds = seconds_since(batch_start);
  return result;
}

}  // namespace zest
