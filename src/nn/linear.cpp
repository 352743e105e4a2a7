#include "lamp/nn/linear.h"

#include <torch/torch.h>

#include "lamp/nn/float8.h"
#include "lamp/nn/weight_cast.h"

namespace lamp {
namespace nn {

namespace detail {

void check_linear_arguments(const torch::Tensor& input,
                            const torch::Tensor& weight,
                            const torch::Tensor& bias, const std::string& who) {
  TORCH_CHECK(input.defined() && weight.defined(), who,
              ": give an input and a weight.");
  TORCH_CHECK(weight.dim() == 2, who, ": the weight must be [out, in], got ",
              weight.sizes(), ".");
  TORCH_CHECK(input.dim() >= 1 && input.size(-1) == weight.size(1), who,
              ": an input [..., ", weight.size(1), "] fits the weight ",
              weight.sizes(), ", got ", input.sizes(), ".");
  TORCH_CHECK(
      !bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
      who, ": the bias must be [", weight.size(0), "], got ", bias.sizes(),
      ".");
}

} // namespace detail

torch::Tensor linear(const torch::Tensor& input, const torch::Tensor& weight,
                     const torch::Tensor& bias) {
  detail::check_linear_arguments(input, weight, bias, "lamp::nn::linear");
  // torch::linear is the dispatcher's aten::linear (autocast casts the bias
  // with the rest), not torch::nn::functional::linear. Inside a
  // CastWeightsOnce the parameters come already cast (autocast leaves a
  // tensor of its dtype as it is).
  return torch::linear(input, cast_weight(weight), cast_weight(bias));
}

torch::Tensor linear(const torch::Tensor& input,
                     const torch::nn::Linear& layer) {
  TORCH_CHECK(!layer.is_empty(),
              "lamp::nn::linear: the torch::nn::Linear is empty (nullptr); "
              "construct it before the forward.");
  // A layer convert_to_float8() converted computes in FP8.
  if (auto* state = float8_state(*layer)) {
    return float8_linear(input, layer->weight, layer->bias, *state);
  }
  return linear(input, layer->weight, layer->bias);
}

} // namespace nn
} // namespace lamp
