#include "common/gpt_kernels.h"

#include <lamp/nn/float8.h>
#include <lamp/nn/weight_cast.h>
#include <lamp/ops/add_norm.h>
#include <lamp/ops/gelu_mlp.h>
#include <lamp/ops/linear_bgrad.h>
#include <torch/torch.h>

namespace lamp_examples {

std::vector<std::string> gpt_kernel_notes(const lamp::models::GPTOptions& model,
                                          const torch::Device& device,
                                          lamp::Precision precision,
                                          bool fp8_fused_casts) {
  std::vector<std::string> notes;
  const bool fused_casts =
      fp8_fused_casts && precision == lamp::Precision::kFP8;
  if (!model.fused_add_norm() && !model.fused_mlp() &&
      !model.fused_weight_cast() && !model.fused_bias_grad() && !fused_casts) {
    return notes;
  }
  // The residual stream in the model's dtype, the branches and the MLP's
  // products in autocast's where it is on: one element each, for the paths'
  // dtype and device checks.
  const auto policy = lamp::precision_policy(precision);
  const auto stream =
      torch::empty({1, 1}, torch::TensorOptions(device).dtype(
                               policy.model_dtype.value_or(torch::kFloat)));
  const auto branch =
      stream.to(policy.autocast_dtype.value_or(stream.scalar_type()));
  if (model.fused_add_norm()) {
    notes.push_back("residual adds fused with their norms: " +
                    lamp::ops::add_norm_path(stream, branch));
  }
  if (model.fused_mlp()) {
    const int64_t c = model.width();
    const auto options = lamp::ops::GeluMlpOptions().approximate(
        model.gelu() == lamp::models::GPTGelu::kTanh ? "tanh" : "none");
    notes.push_back(
        std::string("MLPs with their biases and GELU fused: ") +
        (precision == lamp::Precision::kFP8
             ? "those whose layers compute in FP8 run unfused; the others: "
             : "") +
        lamp::ops::gelu_mlp_path(branch.expand({1, c}),
                                 branch.expand({4 * c, c}),
                                 branch.expand({c, 4 * c}), options));
  }
  if (model.fused_weight_cast()) {
    notes.push_back(
        std::string("Linear weights cast to autocast's dtype at once: ") +
        (!policy.autocast_dtype.has_value()
             ? std::string("nothing to cast (") + lamp::to_string(precision) +
                   " runs without autocast)"
             : (precision == lamp::Precision::kFP8
                    ? "the layers that compute in FP8 keep their own casts; "
                      "the others: "
                    : "") +
                   lamp::nn::cast_weights_once_path(device)));
  }
  if (model.fused_bias_grad()) {
    const int64_t c = model.width();
    notes.push_back(
        std::string("bias gradients in the weight-gradient products: ") +
        (precision == lamp::Precision::kFP8
             ? "the layers that compute in FP8 keep their own; the others: "
             : "") +
        lamp::ops::linear_bgrad_path(
            branch.expand({1, c}), branch.expand({c, c}),
            model.bias() ? branch.view({1}).expand({c}) : torch::Tensor()));
  }
  if (fused_casts) {
    notes.push_back("FP8 casts in one pass: " +
                    lamp::nn::float8_fused_casts_path(branch));
  }
  return notes;
}

} // namespace lamp_examples
