#include "lamp/amp/train_step.h"

#include <torch/torch.h>

#include <memory>
#include <sstream>
#include <string>

#include "amp/capture_signature.h"
#include "amp/graph_step.h"
#include "lamp/optim/optimizer.h"

// TrainStep's CUDA-graph mode: whether a step may be captured, and the batch
// step that captures and replays it (detail::GraphStep) and notices what
// changed since (detail::CaptureSignature).

namespace lamp {

const NameTable<CudaGraphMode>& cuda_graph_mode_table() {
  static const NameTable<CudaGraphMode> table("CUDA-graph mode",
                                              "CUDA-graph modes",
                                              {{"auto", CudaGraphMode::kAuto},
                                               {"on", CudaGraphMode::kOn},
                                               {"off", CudaGraphMode::kOff}});
  return table;
}

std::string to_string(CudaGraphMode mode) {
  return cuda_graph_mode_table().name(mode);
}

CudaGraphMode parse_cuda_graph_mode(const std::string& name) {
  return cuda_graph_mode_table().parse(name);
}

std::string TrainStep::cuda_graph_unavailable_reason() const {
  std::ostringstream why;
  const auto* on_device = dynamic_cast<const optim::AmpStep*>(optimizer_.get());
  // The device last: the other reasons hold everywhere (and are testable on
  // a CPU).
  if (options_.accumulation_steps() != 1) {
    why << "CUDA graphs capture whole optimizer steps; accumulation_steps "
        << options_.accumulation_steps() << " is not supported with them.";
  } else if (gradient_sync_ != nullptr) {
    why << "CUDA graphs do not capture data-parallel communication (a gradient synchroniser) yet.";
  } else if (on_device == nullptr || !on_device->skips_on_device()) {
    why << "CUDA graphs need an optimizer whose step runs on the device without host reads: one of lamp::optim's SGD, Adam or AdamW on its fused kernels (LibTorch >= 2.4), or another lamp::optim::AmpStep whose skips_on_device() is true.";
  } else if (scaler_.is_enabled() && (!scaler_.options().sync_free() ||
                                      scaler_.options().diagnose_overflow())) {
    why << "CUDA graphs need a sync-free GradScaler (sync_free true, diagnose_overflow false).";
  } else if (!device_.is_cuda()) {
    why << "CUDA graphs need a CUDA device; the model is on " << device_ << ".";
  }
  return why.str();
}

void TrainStep::check_graph_capturable() {
  const auto reason = cuda_graph_unavailable_reason();
  TORCH_CHECK(
      reason.empty(), "lamp::TrainStep: cuda_graph: ", reason,
      " Use TrainStepOptions::cuda_graph kAuto (CUDA graphs where they apply) or kOff.");
  TORCH_CHECK(options_.graph_warmup_steps() >= 1,
              "lamp::TrainStep: graph_warmup_steps must be >= 1, got ",
              options_.graph_warmup_steps(), ".");
  auto* on_device = dynamic_cast<optim::AmpStep*>(optimizer_.get());
  // The warm-up steps create the learning-rate tensors the graph reads.
  on_device->set_device_lr(true);
  graphs_ = std::make_unique<detail::GraphStep>(device_,
                                                options_.graph_warmup_steps());
  signature_ = std::make_unique<detail::CaptureSignature>(model_, options_);
  grad_owners_ = model_params_;
  if (master_) {
    const auto masters = master_->master_params();
    grad_owners_.insert(grad_owners_.end(), masters.begin(), masters.end());
  }
}

StepResult TrainStep::batch_step(const torch::Tensor& input,
                                 const torch::Tensor& target,
                                 const BatchLossFn& loss_fn) {
  const auto eager = [&](const torch::Tensor& in, const torch::Tensor& tgt) {
    return eager_step([&] { return loss_fn(cast_input(in), tgt); });
  };
  if (!graph_enabled_) {
    return eager(input, target);
  }
  if (!graphs_) {
    check_graph_capturable();
  }
  if (graphs_->captured()) {
    const auto what = signature_->changed(*optimizer_, scaler_);
    if (!what.empty()) {
      TORCH_WARN_ONCE(
          "lamp::TrainStep: ", what,
          " changed after the training step was captured in a CUDA graph, which baked it in; the graphs are forgotten and each input shape is captured again after ",
          options_.graph_warmup_steps(),
          " eager steps. (Shown once per process; TrainStep::cuda_graph_captures() counts the captures.)");
      graphs_->clear();
    }
  }
  detail::GraphStep::Hooks hooks;
  hooks.eager = eager;
  hooks.before_capture = [&] {
    // The captured backward allocates the gradients from the graph's pool,
    // where they stay for the replays.
    for (auto& p : model_params_) {
      p.mutable_grad() = torch::Tensor();
    }
    signature_->record(*optimizer_, scaler_);
  };
  hooks.before_replay = [&] {
    dynamic_cast<optim::AmpStep&>(*optimizer_).refresh_device_lr();
  };
  return graphs_->step(input, target, hooks, grad_owners_);
}

int64_t TrainStep::cuda_graph_pool_bytes() const {
  if (!graphs_) {
    return 0;
  }
  const auto memory = graphs_->pool_memory();
  return memory.reserved - memory.allocated;
}

int64_t TrainStep::cuda_graph_pool_reserved_bytes() const {
  return graphs_ ? graphs_->pool_memory().reserved : 0;
}

int64_t TrainStep::cuda_graph_captures() const {
  return graphs_ ? graphs_->captures() : 0;
}

} // namespace lamp
