#include "lamp/nn/norms.h"

#include <torch/nn/functional/instancenorm.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/normalization.h>

#include "lamp/nn/rms_norm.h"

namespace lamp {
namespace nn {

bool is_batch_norm(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&m) != nullptr;
}

bool is_norm(const torch::nn::Module& m) {
  return is_batch_norm(m) ||
         dynamic_cast<const torch::nn::InstanceNorm1dImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::InstanceNorm2dImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::InstanceNorm3dImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::LayerNormImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::GroupNormImpl*>(&m) != nullptr ||
         dynamic_cast<const RMSNormImpl*>(&m) != nullptr;
}

} // namespace nn
} // namespace lamp
