#include "lamp/amp/half.h"

// LibTorch 1.13's modules/instancenorm.h calls functional::detail::
// instance_norm without including it (hidden where <torch/torch.h> is
// precompiled).
#include <torch/nn/functional/instancenorm.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/rnn.h>
#include <torch/utils.h>
#include <torch/version.h>

#include "lamp/amp/precision_support.h"
#include "lamp/nn/norms.h"
#include "lamp/platform/backends.h"
#include "lamp/platform/parameters.h"

namespace lamp {
namespace detail {

void check_half_dtype(torch::Dtype dtype, const char* caller) {
  TORCH_CHECK(dtype == torch::kHalf || dtype == torch::kBFloat16, caller,
              ": dtype must be torch::kHalf or torch::kBFloat16, got ", dtype,
              ".");
}

} // namespace detail

namespace {

bool is_batchnorm(const torch::nn::Module& m) {
  return lamp::nn::is_batch_norm(m);
}

// LayerNorm and GroupNorm kept in FP32 must accept low-precision inputs.
bool needs_mixed_dtype_kernels(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::LayerNormImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::GroupNormImpl*>(&m) != nullptr;
}

// The norms other than BatchNorm (RMSNorm computes in FP32 itself: it is
// kept without mixed-dtype kernels).
bool is_other_norm(const torch::nn::Module& m) {
  return lamp::nn::is_norm(m) && !lamp::nn::is_batch_norm(m);
}

// Casts one floating-point parameter or buffer in place (same TensorImpl, so
// optimizers and other references see the change), with its gradient.
void cast_tensor(torch::Tensor tensor, torch::Dtype dtype) {
  if (!tensor.defined() || !tensor.is_floating_point() ||
      tensor.scalar_type() == dtype) {
    return;
  }
  tensor.set_data(tensor.to(dtype));
  if (tensor.grad().defined()) {
    tensor.mutable_grad() = tensor.grad().to(dtype);
  }
}

// `converted` holds the tensors cast already: a tensor registered in two
// modules (a tied weight) is cast once, by the first module that lists it,
// and stays one tensor.
using Converted = detail::TensorIdentitySet;

void cast_own_tensors(torch::nn::Module& module, torch::Dtype dtype,
                      Converted& converted) {
  const auto cast_once = [&](const torch::Tensor& t) {
    if (converted.insert(t)) {
      cast_tensor(t, dtype);
    }
  };
  for (auto& item : module.named_parameters(/*recurse=*/false)) {
    cast_once(item.value());
  }
  for (auto& item : module.named_buffers(/*recurse=*/false)) {
    cast_once(item.value());
  }
  // As Apex's convert_network: cuDNN wants an RNN's weights in one
  // contiguous block again after they were replaced.
  if (auto* lstm = dynamic_cast<torch::nn::LSTMImpl*>(&module)) {
    lstm->flatten_parameters();
  } else if (auto* gru = dynamic_cast<torch::nn::GRUImpl*>(&module)) {
    gru->flatten_parameters();
  } else if (auto* rnn = dynamic_cast<torch::nn::RNNImpl*>(&module)) {
    rnn->flatten_parameters();
  }
}

void cast_subtree(torch::nn::Module& module, torch::Dtype dtype,
                  Converted& converted) {
  cast_own_tensors(module, dtype, converted);
  for (auto& child : module.children()) {
    cast_subtree(*child, dtype, converted);
  }
}

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

bool keep_fp32(const torch::nn::Module& module, const std::string& name,
               const HalfOptions& options) {
  return (options.keep_batchnorm_fp32() && is_batchnorm(module)) ||
         (options.keep_norm_fp32() && is_other_norm(module)) ||
         (options.keep_fp32() && options.keep_fp32()(name, module));
}

// Refuses a LayerNorm/GroupNorm that keep_norm_fp32 keeps where its
// parameters' device cannot run it on `dtype` inputs. BatchNorm and the
// subtrees the keep_fp32 predicate keeps are not looked into: they get
// low-precision inputs by design and cast them themselves.
void check_kept_norms_can_run(const torch::nn::Module& module,
                              const std::string& name,
                              const HalfOptions& options, const char* caller) {
  if (is_batchnorm(module) ||
      (options.keep_fp32() && options.keep_fp32()(name, module))) {
    return;
  }
  if (needs_mixed_dtype_kernels(module)) {
    for (const auto& p : module.parameters()) {
      TORCH_CHECK(
          mixed_dtype_norm_available(p.device(), options.dtype()), caller,
          ": keep_norm_fp32 keeps '", name, "' in FP32, but this LibTorch's (",
          TORCH_VERSION, ") LayerNorm/GroupNorm on ", p.device(),
          " cannot take ", options.dtype(),
          " inputs with FP32 parameters. Convert with keep_norm_fp32(false) "
          "(the norms then run in ",
          options.dtype(),
          " as the rest of the model), or keep such a norm with "
          "HalfOptions::keep_fp32 inside a module that casts its input to "
          "FP32.");
    }
    return;
  }
  for (const auto& child : module.named_children()) {
    check_kept_norms_can_run(*child.value(), join(name, child.key()), options,
                             caller);
  }
}

void convert_subtree(torch::nn::Module& module, const std::string& name,
                     const HalfOptions& options, Converted& converted) {
  if (keep_fp32(module, name, options)) {
    cast_subtree(module, torch::kFloat, converted);
    return;
  }
  cast_own_tensors(module, options.dtype(), converted);
  for (auto& child : module.named_children()) {
    convert_subtree(*child.value(), join(name, child.key()), options,
                    converted);
  }
}

void batchnorm_to_float(torch::nn::Module& module, Converted& converted) {
  if (is_batchnorm(module)) {
    cast_subtree(module, torch::kFloat, converted);
    return;
  }
  for (auto& child : module.children()) {
    batchnorm_to_float(*child, converted);
  }
}

// A model converted to the other low-precision dtype already: a HalfNetwork
// made by that conversion would feed it inputs of its own dtype. Converting
// again to the same dtype changes nothing and is allowed.
void check_not_converted_otherwise(const torch::nn::Module& module,
                                   torch::Dtype dtype) {
  for (const auto& item : module.named_parameters()) {
    const auto is = item.value().scalar_type();
    TORCH_CHECK(
        !(is == torch::kHalf || is == torch::kBFloat16) || is == dtype,
        "lamp::network_to_half: the model is converted to ", is,
        " already (parameter '", item.key(), "' is ", is,
        "), and converting it to ", dtype,
        " would leave the network_to_half wrapper made then feeding it ", is,
        " inputs. Keep the ", is,
        " model, or build a fresh one and convert "
        "that to ",
        dtype, "; this model is unchanged.");
  }
}

} // namespace

torch::nn::Module& convert_network(torch::nn::Module& module,
                                   const HalfOptions& options) {
  detail::check_half_dtype(options.dtype(), "lamp::network_to_half");
  check_not_converted_otherwise(module, options.dtype());
  if (options.keep_norm_fp32()) {
    check_kept_norms_can_run(module, "", options,
                             "lamp::network_to_half"); // before any change
  }
  torch::NoGradGuard no_grad;
  Converted converted;
  convert_subtree(module, "", options, converted);
  return module;
}

torch::nn::Module& bn_convert_float(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  Converted converted;
  batchnorm_to_float(module, converted);
  return module;
}

InputCastImpl::InputCastImpl(torch::Dtype dtype) : dtype_(dtype) {
  detail::check_half_dtype(dtype, "lamp::InputCast");
}

torch::Tensor InputCastImpl::forward(const torch::Tensor& input) {
  if (!input.is_floating_point()) {
    return input;
  }
  TORCH_CHECK(
      !(dtype_ == torch::kHalf && input.device().is_cpu() &&
        !fp16_compute_available(input.device())),
      "lamp::InputCast: FP16 convolutions and matrix multiplications are not implemented on CPU in this LibTorch (",
      TORCH_VERSION,
      "), so an FP16 network cannot run here. Run on a CUDA device, or use ",
      suggest_low_precision(input.device()),
      " (BF16 networks convert with lamp::HalfOptions(torch::kBFloat16)).");
  return input.to(dtype_);
}

void InputCastImpl::pretty_print(std::ostream& stream) const {
  stream << "lamp::InputCast(dtype=" << dtype_ << ")";
}

HalfNetworkImpl::HalfNetworkImpl(
    std::shared_ptr<torch::nn::Module> model,
    std::function<torch::Tensor(const torch::Tensor&)> forward,
    const HalfOptions& options)
    : model_(std::move(model)),
      forward_(std::move(forward)),
      options_(options),
      cast_(options.dtype()) {
  TORCH_CHECK(
      model_ != nullptr && forward_ != nullptr,
      "lamp::network_to_half: the model or its forward function is null.");
  // The model's own tensors and children under their own names: the same
  // objects, so the names, the state dict and the checkpoints are the
  // model's.
  for (const auto& item : model_->named_parameters(/*recurse=*/false)) {
    register_parameter(item.key(), item.value(), item.value().requires_grad());
  }
  for (const auto& item : model_->named_buffers(/*recurse=*/false)) {
    register_buffer(item.key(), item.value());
  }
  for (const auto& item : model_->named_children()) {
    register_module(item.key(), item.value());
  }
}

torch::Tensor HalfNetworkImpl::forward(const torch::Tensor& input) {
  // A model converted where its kept norms run may have moved since (to a
  // GPU, whose LayerNorm takes no FP32 parameters with FP16/BF16 inputs):
  // looked at again on each new device, on the host.
  if (options_.keep_norm_fp32() &&
      (!checked_device_ || *checked_device_ != input.device())) {
    check_kept_norms_can_run(*model_, "", options_, "lamp::HalfNetwork");
    checked_device_ = input.device();
  }
  return forward_(cast_->forward(input));
}

void HalfNetworkImpl::train(bool on) {
  torch::nn::Module::train(on);
  model_->train(on);
}

void HalfNetworkImpl::pretty_print(std::ostream& stream) const {
  stream << "lamp::HalfNetwork(dtype=" << dtype() << ")";
}

HalfNetwork network_to_half(
    std::shared_ptr<torch::nn::Module> model,
    std::function<torch::Tensor(const torch::Tensor&)> forward,
    const HalfOptions& options) {
  TORCH_CHECK(model != nullptr, "lamp::network_to_half: the model is null.");
  TORCH_CHECK(forward != nullptr,
              "lamp::network_to_half: the forward function is null; give the "
              "function that runs the model (nothing was converted).");
  convert_network(*model, options);
  return HalfNetwork(std::move(model), std::move(forward), options);
}

} // namespace lamp
