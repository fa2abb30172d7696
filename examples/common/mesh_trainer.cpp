#include "common/mesh_trainer.h"

namespace examples {

MeshTrainer::MeshTrainer(const zest::DeviceMesh* mesh, zest::TorchModule& zt, StagedLm& model, int64_t rows,
                         int64_t context, zest::PipelineKind schedule)
    : mesh_(mesh), zt_(zt), model_(model), context_(context), dtype_(model.activation_dtype()) {
  if (mesh_ == nullptr || mesh_->shape().pp == 1) return;
  zest::PipelineOptions po;
  po.schedule = schedule;
  po.micro_batches = static_cast<int>(zt.engine().config().accumulation_steps());
  po.activation_shape = {rows, context, model.hidden_size()};
  po.activation_dtype = dtype_;
  po.tied_group = mesh_->embedding();
  pipe_ = std::make_unique<zest::PipelineStage>(mesh_->pp(), zt, po);
  if (!model.tied_head()) return;
  if (pipe_->first()) {
    pipe_->tie_first(model.embedding_unit(), model.embedding_weight());
    model.set_embedding_tie([pipe = pipe_.get()](const torch::Tensor& x) { return pipe->tied(x); });
  } else if (pipe_->last()) {
    model.set_head_weight(pipe_->tie_last({model.vocab_size() / mesh_->shape().tp, model.hidden_size()}, dtype_));
  }
}

namespace {

// The batch's packing (positions and document ids on `device`, or none) on the model.
void set_packing_of(StagedLm& model, const Batch& b, const torch::Device& device) {
  model.set_packing(b.positions.defined() ? b.positions.to(device) : torch::Tensor(),
                    b.documents.defined() ? b.documents.to(device) : torch::Tensor());
}

}  // namespace

MeshTrainer::Step MeshTrainer::train_step(const std::vector<Batch>& micro_batches, int64_t global_trained) {
  const torch::Device device = zest::torch_device(zt_.engine().comm().device());
  const UnitRunner run = runner(zt_);
  // The engine divides the summed gradients by micro-batches x ranks.
  const double per_token = global_trained > 0 ? static_cast<double>(micro_batches.size()) *
                                                    static_cast<double>(zt_.engine().comm().size()) /
                                                    static_cast<double>(global_trained)
                                              : 0.0;
  const auto loss_of = [&](const torch::Tensor& logits, const Batch& b) {
    const torch::Tensor targets = b.targets.to(device);
    return per_token > 0 ? model_.loss_sum(logits, targets) * per_token : model_.loss(logits, targets);
  };
  const auto forward = [&](const Batch& b, const torch::Tensor& in) {
    set_packing_of(model_, b, device);
    return model_.forward_stage(in.defined() ? in : b.inputs.to(device), run);
  };
  Step out;
  if (!pipe_) {
    for (const Batch& b : micro_batches) {
      const MicroStep s = backward_and_step(zt_, loss_of(forward(b, torch::Tensor()), b));
      out.loss += s.loss / static_cast<float>(micro_batches.size());
      out.result = s.result;
    }
    model_.set_packing({}, {});
    return out;
  }
  const zest::PipelineStage::Result r = pipe_->run(
      [&](int mb, const torch::Tensor& in) { return forward(micro_batches.at(static_cast<size_t>(mb)), in); },
      [&](int mb, const torch::Tensor& logits) { return loss_of(logits, micro_batches.at(static_cast<size_t>(mb))); });
  model_.set_packing({}, {});
  out.loss = static_cast<float>(r.loss);
  out.result = r.step;
  return out;
}

double MeshTrainer::loss_sum(const Batch& b) {
  const torch::Device device = zest::torch_device(zt_.engine().comm().device());
  const torch::NoGradGuard no_grad;
  set_packing_of(model_, b, device);
  const torch::Tensor logits = forward_only(b.inputs.to(device));
  model_.set_packing({}, {});
  const double sum =
      logits.defined() ? model_.loss_sum(logits, b.targets.to(device)).to(torch::kDouble).item<double>() : 0.0;
  return pipe_ ? zest::from_last_stage(mesh_->pp(), sum) : sum;
}

torch::Tensor MeshTrainer::forward_only(const torch::Tensor& tokens) {
  const UnitRunner run = runner(zt_);
  // A stage's forward: from the previous stage's activations, or on the
  // first from the tokens.
  const auto stage = [&](const torch::Tensor& in) { return model_.forward_stage(in.defined() ? in : tokens, run); };
  const torch::Tensor out =
      pipe_ ? zest::pipeline_forward(mesh_->pp(), {tokens.size(0), tokens.size(1), model_.hidden_size()}, dtype_, stage)
            : stage(torch::Tensor());
  // At stage 3 the engine's inference order is then one forward, as
  // DeepSpeed's is: each pass of a generation replays it.
  zt_.engine().end_forward();
  return out;
}

double MeshTrainer::validation_loss(const Corpus& corpus, int64_t windows) {
  return examples::validation_loss(
      zt_.engine(),
      [&](const torch::Tensor& tokens, const torch::Tensor& targets) {
        const torch::Tensor logits = forward_only(tokens);
        const double sum = logits.defined() ? model_.loss_sum(logits, targets).to(torch::kDouble).item<double>() : 0.0;
        return pipe_ ? zest::from_last_stage(mesh_->pp(), sum) : sum;
      },
      corpus, windows, context_);
}

torch::Tensor MeshTrainer::last_logits(const torch::Tensor& tokens) {
  const torch::Device device = zest::torch_device(zt_.engine().comm().device());
  const int64_t last_position = tokens.size(1) - 1;
  const torch::Tensor logits = forward_only(tokens.to(device));
  torch::Tensor next = torch::empty({model_.vocab_size()}, torch::TensorOptions().dtype(dtype_).device(device));
  if (logits.defined()) next.copy_(model_.whole_logits(logits).select(1, last_position).squeeze(0));
  if (pipe_) {
    zest::Communicator& pp = mesh_->pp();
    pp.broadcast(next.data_ptr(), next.data_ptr(), static_cast<size_t>(next.numel()),
                 zest::from_torch_dtype(dtype_, "logits"), pp.size() - 1, zest::Stream::default_for(pp.device()));
  }
  return next.to(torch::kCPU);
}

}  // namespace examples
