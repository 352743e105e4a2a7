#include "lamp/nn/rms_norm.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <utility>

namespace lamp {
namespace nn {
namespace {

// The default eps: the machine epsilon of the dtype the norm computes in,
// FP32 for 16-bit inputs, as Python's rms_norm takes it since PyTorch 2.7
// (its "opmath" type; 2.4 to 2.6 took the input's own, 2^-7 for BF16, which
// moved a BF16 activation of RMS 0.02 by 80%).
double machine_epsilon(torch::ScalarType dtype) {
  return dtype == torch::kDouble ? std::numeric_limits<double>::epsilon()
                                 : std::numeric_limits<float>::epsilon();
}

} // namespace

RMSNormOptions::RMSNormOptions(std::vector<int64_t> normalized_shape)
    : normalized_shape_(std::move(normalized_shape)) {}

torch::Tensor rms_norm(const torch::Tensor& input,
                       const std::vector<int64_t>& normalized_shape,
                       const torch::Tensor& weight, c10::optional<double> eps) {
  const auto n = static_cast<int64_t>(normalized_shape.size());
  TORCH_CHECK(input.defined() && input.is_floating_point(),
              "lamp::nn::rms_norm: the input must be a floating-point tensor.");
  TORCH_CHECK(!eps.has_value() || (std::isfinite(*eps) && *eps >= 0),
              "lamp::nn::rms_norm: eps must be finite and >= 0, got ", *eps,
              " (a negative eps makes the rows of small values NaN); leave "
              "it unset for the machine epsilon.");
  TORCH_CHECK(n >= 1 && input.dim() >= n &&
                  input.sizes().slice(input.dim() - n) ==
                      torch::IntArrayRef(normalized_shape),
              "lamp::nn::rms_norm: normalized_shape ",
              torch::IntArrayRef(normalized_shape),
              " must be the trailing sizes of the input, whose sizes are ",
              input.sizes(), ".");
  TORCH_CHECK(!weight.defined() ||
                  weight.sizes() == torch::IntArrayRef(normalized_shape),
              "lamp::nn::rms_norm: the weight has sizes ",
              weight.defined() ? weight.sizes() : torch::IntArrayRef{},
              " but normalized_shape is ", torch::IntArrayRef(normalized_shape),
              ".");
  std::vector<int64_t> dims;
  for (int64_t d = input.dim() - n; d < input.dim(); ++d) {
    dims.push_back(d);
  }
  const auto wide =
      input.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  const auto x = input.to(wide);
  auto y = x * torch::rsqrt(x.pow(2).mean(dims, /*keepdim=*/true) +
                            eps.value_or(machine_epsilon(input.scalar_type())));
  if (weight.defined()) {
    y = y * weight.to(wide);
  }
  return y.to(input.scalar_type());
}

RMSNormImpl::RMSNormImpl(RMSNormOptions options_)
    : options(std::move(options_)) {
  reset();
}

void RMSNormImpl::reset() {
  if (options.elementwise_affine()) {
    weight =
        register_parameter("weight", torch::ones(options.normalized_shape()));
  } else {
    weight = register_parameter("weight", torch::Tensor(),
                                /*requires_grad=*/false);
  }
}

void RMSNormImpl::reset_parameters() {
  if (weight.defined()) {
    torch::NoGradGuard no_grad;
    weight.fill_(1.0);
  }
}

void RMSNormImpl::pretty_print(std::ostream& stream) const {
  stream << "lamp::nn::RMSNorm("
         << torch::IntArrayRef(options.normalized_shape()) << ", eps=";
  if (options.eps()) {
    stream << *options.eps();
  } else {
    stream << "None";
  }
  stream << ", elementwise_affine="
         << (options.elementwise_affine() ? "true" : "false") << ")";
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& input) {
  return rms_norm(input, options.normalized_shape(), weight, options.eps());
}

} // namespace nn
} // namespace lamp
