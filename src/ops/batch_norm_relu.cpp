#include "lamp/ops/batch_norm_relu.h"

#include <ATen/Context.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "ops/cudnn_batch_norm.h"
#include "platform/differentiable_once.h"

namespace lamp {
namespace ops {
namespace {

constexpr const char* kBatchNormReluWho = "lamp::ops::batch_norm_relu";

// Set by detail::ScopedReferenceKernels (tests), read on every call.
std::atomic<bool> reference_kernels{false};

// Configurations cuDNN refused (CUDNN_STATUS_NOT_SUPPORTED) in this process:
// they run the stock composition from then on, after one warning each.
std::mutex refused_mutex;
std::set<std::string> refused;
// Whether `refused` has any entry: until cuDNN refuses one, a call neither
// builds its configuration's key nor takes the lock.
std::atomic<bool> any_refused{false};

std::string configuration_key(const torch::Tensor& input, bool residual) {
  std::ostringstream key;
  key << input.scalar_type() << ' ' << input.sizes() << ' ' << input.device()
      << (residual ? " +add" : "");
  return key.str();
}

bool was_refused(const torch::Tensor& input, bool residual) {
  if (!any_refused.load()) {
    return false;
  }
  const auto key = configuration_key(input, residual);
  std::lock_guard<std::mutex> lock(refused_mutex);
  return refused.count(key) != 0;
}

void remember_refusal(const std::string& key, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(refused_mutex);
    if (!refused.insert(key).second) {
      return;
    }
    any_refused.store(true);
  }
  TORCH_WARN(kBatchNormReluWho, ": cuDNN does not fuse this configuration (",
             key, "): ", why,
             " It runs as separate BatchNorm, add and ReLU ops.");
}

// ATen's own kernels in the fused path's shape (tests, on any device): the
// exact ops the stock composition runs, so its values and gradients are the
// composition's to the bit.
bool reference_forward(const torch::Tensor& x, const torch::Tensor& z,
                       const torch::Tensor& weight, const torch::Tensor& bias,
                       const torch::Tensor& running_mean,
                       const torch::Tensor& running_var, double factor,
                       double eps,
                       lamp::detail::FusedBatchNormForward& result) {
  auto normalised =
      at::native_batch_norm(x, weight, bias, running_mean, running_var,
                            /*training=*/true, factor, eps);
  auto y = std::get<0>(normalised);
  result.output = torch::relu(z.defined() ? y + z : y);
  result.save_mean = std::get<1>(normalised);
  result.save_invstd = std::get<2>(normalised);
  result.reserve = torch::empty({0}, x.options().dtype(torch::kByte));
  return true;
}

lamp::detail::FusedBatchNormBackward reference_backward(
    const torch::Tensor& grad_output, const torch::Tensor& x, bool has_residual,
    const torch::Tensor& weight,
    const lamp::detail::FusedBatchNormForward& saved, double eps) {
  // ReLU's backward on its output, as torch::relu's autograd does.
  auto grad = torch::threshold_backward(grad_output, saved.output, 0);
  auto grads = at::native_batch_norm_backward(
      grad, x, weight, torch::Tensor(), torch::Tensor(), saved.save_mean,
      saved.save_invstd, /*train=*/true, eps, {true, true, true});
  lamp::detail::FusedBatchNormBackward result;
  result.input = std::get<0>(grads);
  result.weight = std::get<1>(grads);
  result.bias = std::get<2>(grads);
  if (has_residual) {
    result.residual = grad;
  }
  return result;
}

// The fused op once its forward has run (outside, so that a configuration
// cuDNN refuses can still take the stock composition): records the graph
// and runs the matching backward. Two node types, as a custom autograd
// function takes no undefined tensor: FusedBatchNormRelu and
// FusedBatchNormAddRelu, sharing these two.
torch::Tensor save_for_backward(
    torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
    const torch::Tensor& residual, const torch::Tensor& weight,
    const torch::Tensor& bias,
    const lamp::detail::FusedBatchNormForward& computed, double eps,
    bool reference) {
  ctx->save_for_backward({input, residual, weight, bias, computed.output,
                          computed.save_mean, computed.save_invstd,
                          computed.reserve});
  ctx->saved_data["eps"] = eps;
  ctx->saved_data["reference"] = reference;
  ctx->saved_data["reserve_size"] = computed.reserve_size;
  return computed.output;
}

lamp::detail::FusedBatchNormBackward fused_backward(
    torch::autograd::AutogradContext* ctx,
    const torch::autograd::variable_list& grad_outputs) {
  lamp::detail::refuse_higher_order_gradients(
      kBatchNormReluWho, "Turn the fusion off where you need them: ",
      lamp::detail::kFusionOffAdvice, ".");
  const auto saved = ctx->get_saved_variables();
  const auto& input = saved[0];
  const bool has_residual = saved[1].defined();
  lamp::detail::FusedBatchNormForward forward;
  forward.output = saved[4];
  forward.save_mean = saved[5];
  forward.save_invstd = saved[6];
  forward.reserve = saved[7];
  forward.reserve_size = ctx->saved_data["reserve_size"].toInt();
  const double eps = ctx->saved_data["eps"].toDouble();
  auto grad = grad_outputs[0];
  if (!grad.defined()) {
    grad = torch::zeros_like(forward.output);
  }
  return ctx->saved_data["reference"].toBool()
             ? reference_backward(grad, input, has_residual, saved[2], forward,
                                  eps)
             : lamp::detail::cudnn_batch_norm_activation_backward(
                   grad, input, has_residual, saved[2], saved[3], forward, eps);
}

struct FusedBatchNormRelu
    : public torch::autograd::Function<FusedBatchNormRelu> {
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
      const torch::Tensor& weight, const torch::Tensor& bias,
      const lamp::detail::FusedBatchNormForward* computed, double eps,
      bool reference) {
    return save_for_backward(ctx, input, torch::Tensor(), weight, bias,
                             *computed, eps, reference);
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad_outputs) {
    const auto grads = fused_backward(ctx, grad_outputs);
    return {grads.input,     grads.weight,    grads.bias,
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

struct FusedBatchNormAddRelu
    : public torch::autograd::Function<FusedBatchNormAddRelu> {
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
      const torch::Tensor& residual, const torch::Tensor& weight,
      const torch::Tensor& bias,
      const lamp::detail::FusedBatchNormForward* computed, double eps,
      bool reference) {
    return save_for_backward(ctx, input, residual, weight, bias, *computed, eps,
                             reference);
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad_outputs) {
    const auto grads = fused_backward(ctx, grad_outputs);
    return {grads.input,     grads.residual,  grads.weight,   grads.bias,
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// An FP32 vector of `channels` values on `device` (the input's): a
// parameter left on another device would hand cuDNN pointers it cannot read.
bool is_float_vector(const torch::Tensor& t, int64_t channels,
                     const torch::Device& device) {
  return t.scalar_type() == torch::kFloat && t.dim() == 1 &&
         t.numel() == channels && t.is_contiguous() && t.device() == device;
}

// Checks shared by both paths, with the stock ops' wording where they have
// one.
void check_arguments(const torch::Tensor& input,
                     const torch::Tensor& residual) {
  TORCH_CHECK(input.defined(), kBatchNormReluWho,
              ": the input is an undefined tensor.");
  if (residual.defined()) {
    TORCH_CHECK(residual.sizes() == input.sizes(),
                "lamp::ops::batch_norm_add_relu: ",
                "the residual must have the input's shape ", input.sizes(),
                ", got ", residual.sizes(), ".");
  }
}

torch::Tensor composition(const torch::Tensor& input,
                          const torch::Tensor& residual,
                          const torch::Tensor& weight,
                          const torch::Tensor& bias,
                          const torch::Tensor& running_mean,
                          const torch::Tensor& running_var, bool training,
                          double momentum, double eps) {
  // torch::nn::functional::batch_norm's call, as BatchNorm2d::forward makes
  // it.
  auto out = torch::nn::functional::detail::batch_norm(
      input, running_mean, running_var, weight, bias, training, momentum, eps);
  return torch::relu(residual.defined() ? out + residual : out);
}

// The fused op, for arguments batch_norm_relu_fallback_reason() accepted
// (training mode).
torch::Tensor fused(const torch::Tensor& input, const torch::Tensor& residual,
                    const torch::Tensor& weight, const torch::Tensor& bias,
                    const torch::Tensor& running_mean,
                    const torch::Tensor& running_var, double momentum,
                    double eps) {
  // The stock op's check (cuDNN would normalise a single value to 0).
  TORCH_CHECK(input.numel() / input.size(1) != 1,
              "Expected more than 1 value per channel when training, got "
              "input size ",
              input.sizes());
  const bool reference = reference_kernels.load();
  lamp::detail::FusedBatchNormForward computed;
  {
    torch::NoGradGuard no_grad;
    if (reference) {
      reference_forward(input, residual, weight, bias, running_mean,
                        running_var, momentum, eps, computed);
    } else {
      std::string why;
      if (!lamp::detail::cudnn_batch_norm_activation_forward(
              input, residual, weight, bias, running_mean, running_var,
              momentum, eps, computed, why)) {
        remember_refusal(configuration_key(input, residual.defined()), why);
        return composition(input, residual, weight, bias, running_mean,
                           running_var, /*training=*/true, momentum, eps);
      }
    }
  }
  if (residual.defined()) {
    return FusedBatchNormAddRelu::apply(input, residual, weight, bias,
                                        &computed, eps, reference);
  }
  return FusedBatchNormRelu::apply(input, weight, bias, &computed, eps,
                                   reference);
}

torch::Tensor batch_norm_activation(
    const torch::Tensor& input, const torch::Tensor& residual,
    const torch::Tensor& weight, const torch::Tensor& bias,
    const torch::Tensor& running_mean, const torch::Tensor& running_var,
    bool training, double momentum, double eps) {
  check_arguments(input, residual);
  if (!batch_norm_relu_fallback_reason(input, residual, weight, bias,
                                       running_mean, running_var, training)
           .empty()) {
    return composition(input, residual, weight, bias, running_mean, running_var,
                       training, momentum, eps);
  }
  return fused(input, residual, weight, bias, running_mean, running_var,
               momentum, eps);
}

// What BatchNorm2d::forward does around torch::batch_norm, with the fused op
// in its place where it applies.
torch::Tensor module_form(const torch::Tensor& input,
                          const torch::Tensor& residual,
                          const torch::nn::BatchNorm2d& bn) {
  TORCH_CHECK(!bn.is_empty(), kBatchNormReluWho,
              ": the BatchNorm2d is empty (nullptr).");
  check_arguments(input, residual);
  auto& impl = *bn.ptr();
  const auto& options = impl.options;
  const bool batch_statistics =
      impl.is_training() || !options.track_running_stats();
  if (!batch_norm_relu_fallback_reason(input, residual, impl.weight, impl.bias,
                                       impl.running_mean, impl.running_var,
                                       batch_statistics)
           .empty()) {
    auto out = impl.forward(input);
    return torch::relu(residual.defined() ? out + residual : out);
  }
  double factor = options.momentum().value_or(0.0);
  if (impl.is_training() && options.track_running_stats() &&
      impl.num_batches_tracked.defined()) {
    impl.num_batches_tracked += 1;
    if (!options.momentum()) {
      factor = 1.0 / impl.num_batches_tracked.item<double>();
    }
  }
  return fused(input, residual, impl.weight, impl.bias, impl.running_mean,
               impl.running_var, factor, options.eps());
}

} // namespace

torch::Tensor batch_norm_relu(const torch::Tensor& input,
                              const torch::nn::BatchNorm2d& bn) {
  return module_form(input, torch::Tensor(), bn);
}

torch::Tensor batch_norm_add_relu(const torch::Tensor& input,
                                  const torch::Tensor& residual,
                                  const torch::nn::BatchNorm2d& bn) {
  TORCH_CHECK(residual.defined(), "lamp::ops::batch_norm_add_relu: ",
              "the residual is an undefined tensor.");
  return module_form(input, residual, bn);
}

torch::Tensor batch_norm_relu(const torch::Tensor& input,
                              const torch::Tensor& weight,
                              const torch::Tensor& bias,
                              const torch::Tensor& running_mean,
                              const torch::Tensor& running_var, bool training,
                              double momentum, double eps) {
  return batch_norm_activation(input, torch::Tensor(), weight, bias,
                               running_mean, running_var, training, momentum,
                               eps);
}

torch::Tensor batch_norm_add_relu(const torch::Tensor& input,
                                  const torch::Tensor& residual,
                                  const torch::Tensor& weight,
                                  const torch::Tensor& bias,
                                  const torch::Tensor& running_mean,
                                  const torch::Tensor& running_var,
                                  bool training, double momentum, double eps) {
  TORCH_CHECK(residual.defined(), "lamp::ops::batch_norm_add_relu: ",
              "the residual is an undefined tensor.");
  return batch_norm_activation(input, residual, weight, bias, running_mean,
                               running_var, training, momentum, eps);
}

std::string batch_norm_relu_fallback_reason(const torch::Tensor& input,
                                            const torch::Tensor& residual,
                                            const torch::Tensor& weight,
                                            const torch::Tensor& bias,
                                            const torch::Tensor& running_mean,
                                            const torch::Tensor& running_var,
                                            bool training) {
  // Runs on every call: the strings are built only for a reason to give.
  const bool reference = reference_kernels.load();
  if (!reference) {
    std::string built;
    if (!batch_norm_relu_fusion_built(&built)) {
      return built;
    }
  }
  if (!input.defined() || input.dim() != 4) {
    return "the input is not 4-D [N, C, H, W].";
  }
  if (input.numel() == 0) {
    // The stock op returns the empty output and leaves the running
    // statistics alone; the kernels would average over no value.
    return "the input is empty.";
  }
  if (!reference && !input.is_cuda()) {
    return "the input is on " + input.device().str() + ", not CUDA.";
  }
  if (!reference && input.scalar_type() != torch::kHalf &&
      input.scalar_type() != torch::kBFloat16) {
    return std::string("the input is ") + c10::toString(input.scalar_type()) +
           "; the fused kernels take Half or BFloat16 activations.";
  }
  if (!reference && !input.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    return "the input is not channels_last-contiguous (NHWC).";
  }
  // ATen's own limits before it picks cuDNN's BatchNorm: some cuDNN kernels
  // index in 32 bits, and its training kernels take at most 880801 images.
  if (!reference && input.numel() >= std::numeric_limits<int32_t>::max()) {
    return "the input has " + std::to_string(input.numel()) +
           " elements, 2^31 - 1 or more, beyond cuDNN's 32-bit indexing.";
  }
  if (!reference && input.size(0) > 880801) {
    return "the batch of " + std::to_string(input.size(0)) +
           " images is larger than cuDNN's training BatchNorm takes "
           "(880801).";
  }
  if (!training) {
    return "evaluation mode (running statistics): the fused kernels train.";
  }
  if (residual.defined() && (residual.scalar_type() != input.scalar_type() ||
                             residual.device() != input.device() ||
                             residual.strides() != input.strides())) {
    return "the residual differs from the input in dtype, device or layout.";
  }
  const int64_t channels = input.size(1);
  if (!weight.defined() || !bias.defined() ||
      !is_float_vector(weight, channels, input.device()) ||
      !is_float_vector(bias, channels, input.device())) {
    return "weight and bias are not both float vectors of C = " +
           std::to_string(channels) +
           " elements on the input's device (an affine BatchNorm kept in "
           "FP32, as network_to_half does, moved with the model).";
  }
  if (running_mean.defined() != running_var.defined() ||
      (running_mean.defined() &&
       (!is_float_vector(running_mean, channels, input.device()) ||
        !is_float_vector(running_var, channels, input.device())))) {
    return "the running statistics are not both float vectors of C elements "
           "on the input's device (or both absent).";
  }
  if (!reference && was_refused(input, residual.defined())) {
    return "cuDNN refused this configuration earlier in this process.";
  }
  return "";
}

bool batch_norm_relu_fusion_built(std::string* why) {
  const auto reason = lamp::detail::cudnn_batch_norm_unavailable_reason();
  if (why != nullptr) {
    *why = reason;
  }
  return reason.empty();
}

namespace detail {

ScopedReferenceKernels::ScopedReferenceKernels()
    : previous_(reference_kernels.exchange(true)) {}

ScopedReferenceKernels::~ScopedReferenceKernels() {
  reference_kernels.store(previous_);
}

std::vector<torch::Tensor> batch_norm_relu_saved_tensors(
    const torch::Tensor& output) {
  const auto* grad_fn = output.defined() ? output.grad_fn().get() : nullptr;
  using torch::autograd::CppNode;
  if (const auto* node =
          dynamic_cast<const CppNode<FusedBatchNormRelu>*>(grad_fn)) {
    return node->ctx_.get_saved_variables();
  }
  if (const auto* node =
          dynamic_cast<const CppNode<FusedBatchNormAddRelu>*>(grad_fn)) {
    return node->ctx_.get_saved_variables();
  }
  return {};
}

} // namespace detail

} // namespace ops
} // namespace lamp
